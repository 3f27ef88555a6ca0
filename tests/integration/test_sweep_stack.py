"""One study end to end through the real CLI, on the team stack (tests/conftest.py team_stack: PostgreSQL, moto, MLflow
and Prefect servers), with a worker killed mid-trial.

`torchship stack up --workers 2` starts two Prefect workers on the pool; `torchship stack env` hands every client the
study database's URL (no password) and its role's password as PGPASSWORD. The `sweep-trial` deployment (prefect.yaml)
is deployed from a fresh tiny project, and `torchship sweep` starts two of its flow runs, the sweep's workers, on the
pool: two trials, trial 0 the params.yaml configuration, the study in PostgreSQL, MLflow on the server. As soon as a
trial runs, its worker (the flow run's process and everything it started) is SIGKILLed: the trial's heartbeat stops,
the other worker marks it failed and runs its queued copy (RetryHeartbeatStaleTrialCallback), and the study completes.
Then the winner, re-judged by bless on the holdout, is the only version the registry holds, tagged with its study and
optimism, and nothing else moved.

Shared work: prepare and validate ran once (in the study's template) for every trial, and every trial saw the same
holdout; the search ran no stage that reads it. MLflow holds one parent run for the study and a child per ended trial.
No password is in the output, the study or a command line; the project's params.yaml is untouched. A second sweep of
the same study, its workers' loop here in process, runs nothing more."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import optuna
import psutil
import pytest
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from flows.cli.stack.lifecycle import shell_env, stack_up
from flows.cli.stack.state import SWEEP_DB_SECRET, read_env_file
from tasks.sweep.study import REASON, STORAGE_ENV
from tasks.sweep.worker import work
from tests.conftest import BIN, TEAM_STACK_GROUP, make_project
from tests.helpers.stack import evaluated, mlflow_http

pytestmark = [pytest.mark.integration, pytest.mark.stack, pytest.mark.xdist_group(TEAM_STACK_GROUP),
              pytest.mark.timeout(900), pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")]
STUDY, MODEL = "stack-sweep", "sweep-on-stack"
LIGHT = {"data": {"rows": 1200, "model_name": MODEL},
         "train": {"model": "mlp", "cv_max_rows": 0, "epochs": 3, "model_args": {}},
         "distill": {"enabled": False}, "export": {"compile": False, "onnx_exporter": "legacy"},
         "baseline": {"cv_max_rows": 0},
         "sweep": {"study": STUDY, "trials": 2, "workers": 2, "top_k": 1, "pruner": "none", "heartbeat_s": 1,
                   "grace_s": 4}}
SWEEP_TIMEOUT_S = 840


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started, as a machine that dies takes them all (the stages' `dvc repro`
    and its stage run in sessions of their own)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def first_running_trial(storage: str, sweep: subprocess.Popen, timeout: float = 600):
    """The first trial a worker has started (its folder made, its worker named), once the study exists."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(KeyError):   # the driver has not created the study yet
            trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
            started = [t for t in trials if t.state == TrialState.RUNNING and {"worker", "folder"} <= set(t.user_attrs)]
            if started:
                return started[0]
        assert sweep.poll() is None, "torchship sweep ended before any trial ran"
        assert time.monotonic() < deadline, f"no trial ran within {timeout:.0f} s"
        time.sleep(0.5)


def test_a_study_on_the_team_stack_survives_a_killed_worker_and_registers_only_a_judged_winner(
        team_stack, tmp_path, monkeypatch):
    stack_up(team_stack, 2, os.environ)   # in process: the CLI's own test is test_stack.py's
    sweep = None
    try:
        env = evaluated(shell_env(team_stack))
        assert env[STORAGE_ENV].startswith("postgresql+psycopg2://torchship_sweep@") and "PGPASSWORD" in env
        project = make_project(tmp_path / "project", LIGHT)
        settings = [f"tracking.uri={env['MLFLOW_TRACKING_URI']}", "tracking.artifacts=null"]
        before = (project.root / "params.yaml").read_text()
        run_env = {**project.env(), **env}
        deployed = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "sweep-trial"],
                                  cwd=project.root, env=run_env, capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        log = tmp_path / "sweep.log"
        with log.open("w") as written:   # a file, not a pipe: nothing blocks the CLI while this test watches
            sweep = subprocess.Popen([str(BIN / "torchship"), "sweep", *[f"--set={s}" for s in settings]],
                                     cwd=project.root, env=run_env, stdout=written, stderr=subprocess.STDOUT)
        monkeypatch.setenv("PGPASSWORD", env["PGPASSWORD"])
        storage = env[STORAGE_ENV]
        victim = first_running_trial(storage, sweep)
        kill_tree(int(victim.user_attrs["worker"].rsplit(":", 1)[1]))   # mid-trial: its stages are running
        sweep.wait(timeout=SWEEP_TIMEOUT_S)
        output = log.read_text()
        assert sweep.returncode == 0, output[-5000:]
    finally:
        if sweep is not None and sweep.poll() is None:
            kill_tree(sweep.pid)
        stack_up(team_stack, 0, os.environ)
    assert (project.root / "params.yaml").read_text() == before

    trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    killed = trials[victim.number]
    assert killed.state == TrialState.FAIL and REASON not in killed.user_attrs, killed   # its heartbeat went silent
    again = [t for t in trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == victim.number]
    assert len(again) == 1 and again[0].state == TrialState.COMPLETE, [(t.number, t.state) for t in trials]
    assert again[0].user_attrs["worker"] != victim.user_attrs["worker"]   # the other worker finished it
    ended = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(ended) == 2 and trials[0].user_attrs["role"] == "champion"

    template = json.loads((project.root / f".sweep/{STUDY}/template/template.json").read_text())
    assert template["stages"] == {"prepare": "ran", "validate": "ran"}
    for trial in ended:   # DVC skipped prepare and validate in every trial's folder: only train ran
        assert trial.user_attrs["stages"] == {"prepare": "skipped", "validate": "skipped", "train": "ran"}, trial
    assert {t.user_attrs["holdout_sha256"] for t in ended} == {template["holdout_sha256"]}
    assert "'prepare_runs': 1, 'validate_runs': 1, 'holdout_hashes': 1" in " ".join(output.split())

    with mlflow_http(env) as mlflow:
        found = mlflow.get("/model-versions/search", params={"filter": f"name='{MODEL}'"}).json()["model_versions"]
        model = mlflow.get("/registered-models/get", params={"name": MODEL}).json()["registered_model"]
        experiments = mlflow.post("/experiments/search", json={"max_results": 100}).json()["experiments"]
        runs = mlflow.post("/runs/search", json={
            "experiment_ids": [e["experiment_id"] for e in experiments], "max_results": 500,
            "filter": f"tags.`torchship.sweep.study` = '{STUDY}'"}).json()["runs"]
    assert len(found) == 1, found   # the judged winner, and nothing else
    tags = {t["key"]: t["value"] for t in found[0].get("tags", [])}
    assert tags["sweep_study"] == STUDY and float(tags["sweep_optimism"]) == pytest.approx(
        float(tags["sweep_validation"]) - float(tags["holdout_f1_macro"]), abs=1e-3), tags
    assert {a["alias"]: a["version"] for a in model.get("aliases", [])} == {"champion": "1"}
    children = [r for r in runs if any(t["key"] == "torchship.sweep.trial" for t in r["data"].get("tags", []))]
    assert len(runs) - len(children) == 1 and len(children) == len(trials), [r["info"]["run_name"] for r in runs]

    secret = read_env_file(team_stack.secrets)[SWEEP_DB_SECRET]
    definition = json.dumps(optuna.load_study(study_name=STUDY, storage=storage).user_attrs)
    assert secret not in output and secret not in definition and secret not in storage
    monkeypatch.setenv(STORAGE_ENV, storage)   # a second sweep of the study: its workers find nothing to do
    assert work(STUDY, project.root, echo=io.StringIO()) == 0
    assert len(optuna.load_study(study_name=STUDY, storage=storage).trials) == len(trials)
