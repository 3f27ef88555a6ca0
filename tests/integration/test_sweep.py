"""One study end to end through the real CLI, on a tiny table: `torchship sweep` with two local workers, three trials
(trial 0 the params.yaml configuration), the median pruner on, the best re-judged by bless on the holdout.

Shared work: prepare and validate ran once (in the study's template) for all the trials, and every trial saw the
same holdout. The search ran no stage that reads the holdout. MLflow holds one parent run for the study and a child
per trial. The winner (a first model: no champion) is registered, with its optimism on the version; the project's
params.yaml is untouched. A second `sweep` of the same study runs nothing more."""
from __future__ import annotations

import json
import sqlite3

import optuna
import pytest

from tests.conftest import make_project

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
SWEEP = {"trials": 3, "workers": 2, "top_k": 1, "prune_startup_trials": 2, "prune_warmup_epochs": 1,
         "heartbeat_s": 2, "grace_s": 6}
LIGHT = {"data": {"rows": 1200}, "train": {"model": "mlp", "cv_max_rows": 0, "epochs": 3, "model_args": {}},
         "distill": {"enabled": False}, "export": {"compile": False, "onnx_exporter": "legacy"},
         "baseline": {"cv_max_rows": 0}, "sweep": SWEEP}


def test_a_study_shares_its_prepared_data_and_registers_only_a_judged_winner(tmp_path):
    project = make_project(tmp_path / "project", LIGHT)
    before = (project.root / "params.yaml").read_text()
    done = project.torchship("sweep", timeout=840)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (project.root / "params.yaml").read_text() == before
    storage = f"sqlite:///{project.root / '.sweep' / 'studies.db'}"
    study = optuna.load_study(study_name="synthetic-churn-sweep", storage=storage)
    trials = study.get_trials(deepcopy=False)
    ended = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(ended) >= 3 and trials[0].user_attrs["role"] == "champion", [t.state for t in trials]
    template = json.loads((project.root / ".sweep/synthetic-churn-sweep/template/template.json").read_text())
    assert template["stages"] == {"prepare": "ran", "validate": "ran"}
    for trial in ended:   # DVC skipped prepare and validate in every trial's folder; train ran (or was pruned)
        assert trial.user_attrs["stages"]["prepare"] == "skipped", trial.user_attrs
        assert trial.user_attrs["stages"]["validate"] == "skipped", trial.user_attrs
        assert not {"baseline", "export"} & set(trial.user_attrs["stages"])   # the search never read the holdout
    hashes = {t.user_attrs["holdout_sha256"] for t in trials if "holdout_sha256" in t.user_attrs}
    assert hashes == {template["holdout_sha256"]}
    assert "'prepare_runs': 1, 'validate_runs': 1, 'holdout_hashes': 1" in " ".join(done.stdout.split())
    registry = project.registry("synthetic-churn")
    assert registry["aliases"] == {"champion": "1"}, done.stdout[-3000:]
    tags = registry["versions"]["1"]
    assert tags["sweep_study"] == "synthetic-churn-sweep" and float(tags["sweep_optimism"]) == pytest.approx(
        float(tags["sweep_validation"]) - float(tags["holdout_f1_macro"]), abs=1e-3), tags
    with sqlite3.connect(project.root / "mlflow" / "mlflow.db") as db:
        tagged = db.execute("SELECT value FROM tags WHERE key = 'torchship.sweep.trial'").fetchall()
    assert len(tagged) >= 3
    again = project.torchship("sweep", timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert len(optuna.load_study(study_name="synthetic-churn-sweep", storage=storage).trials) == len(trials)
