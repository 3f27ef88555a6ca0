"""One trial: its values written over the study's base params in a folder of its own, then prepare, validate and
train through DVC (tasks/stages/repro.py, as `torchship run` runs them), and its score the train stage's own
validation figure (the out-of-fold one for cross-validated members). The search never runs a stage that reads the
holdout. What the trial did is kept on it (user attrs): which stages ran or were skipped, the holdout's hash, its
folder, its validation metrics, and, when it failed, why."""
from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from tasks.config import parse_params
from tasks.core import paths
from tasks.core.artifacts import read_json
from tasks.core.errors import TorchshipError
from tasks.stages.repro import reproduce
from tasks.sweep import space
from tasks.sweep.study import REASON, STORAGE_ENV
from tasks.sweep.workspace import holdout_hash, own_code_env, ran, trial_folder, write_params_file
from tasks.training.pruning import PRUNED, SWEEP_TRIAL_ENV

TRIAL_STAGES = ("prepare", "validate", "train")   # never baseline (it scores the holdout) nor what follows train


def validation_score(metrics: dict, metric: str) -> float:
    """What the search maximises: the out-of-fold figure of cross-validated members (their validation figure is in
    sample: they trained on those rows), else the validation split's."""
    folds = metrics.get("cross_validation")
    return float(folds["out_of_fold"][metric]) if folds else float(metrics[f"val_{metric}"])


def trial_env(definition: dict, storage: str, trial_id: int, root: Path) -> dict[str, str]:
    """What the train stage's rank 0 needs to report its epochs (tasks/training/pruning.py): no password (the
    storage URL never holds one; PGPASSWORD travels in the environment as it is); and the project folder on the
    import path, for your own module."""
    sweep = definition["sweep"]
    spec = {"storage": storage, "study": definition["study"], "trial_id": trial_id, "metric": definition["metric"],
            "pruner": sweep["pruner"], "startup_trials": sweep["prune_startup_trials"],
            "warmup_epochs": sweep["prune_warmup_epochs"]}
    return {SWEEP_TRIAL_ENV: json.dumps(spec), STORAGE_ENV: storage, **own_code_env(root)}


def run_trial(trial, definition: dict, root: Path, storage: str, echo=None) -> float:
    """The objective: the trial's score, or optuna.TrialPruned; any other failure is recorded on the trial with
    its reason (and raised, so the study marks it failed and goes on)."""
    import optuna

    started = time.perf_counter()
    held = definition["held"] if trial.user_attrs.get("role") == "champion" else {}
    values = space.draw(trial, {k: _range(v) for k, v in definition["sweep"]["space"].items()}, held)
    log = echo or io.StringIO()
    folder = trial_folder(root, definition["study"], trial.number)
    trial.set_user_attr("folder", str(folder))
    trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")   # who ran it (a retry names another)
    trial.set_user_attr("values", json.loads(json.dumps(values)))
    outcomes = []
    try:
        raw = space.with_values(definition["base"], values)
        parse_params(raw, origin=f"trial {trial.number}'s params", root=folder)   # a bad combination: refused now
        write_params_file(folder / "params.yaml", raw)
        env = trial_env(definition, storage, trial._trial_id, root)
        with contextlib.chdir(folder):   # DVC's status resolves a stage's paths from the process's folder
            for stage in TRIAL_STAGES:
                outcomes.append(reproduce(stage, env=env, echo=log))
        metrics = read_json(folder / paths.TRAIN_METRICS)
    except TorchshipError as exc:
        trial.set_user_attr("stages", ran(outcomes))
        trial.set_user_attr("seconds", round(time.perf_counter() - started, 2))
        if PRUNED in str(exc):
            raise optuna.TrialPruned(str(exc).splitlines()[0][:500]) from None
        trial.set_user_attr(REASON, str(exc)[:2000])
        raise
    except BaseException as exc:   # a bug or an interrupt: recorded, so the study does not wait for it
        trial.set_user_attr(REASON, f"{type(exc).__name__}: {str(exc)[:1000]}")
        raise
    score = validation_score(metrics, definition["metric"])
    trial.set_user_attr("stages", ran(outcomes))
    trial.set_user_attr("holdout_sha256", holdout_hash(folder))
    trial.set_user_attr("validation", {key: metrics.get(f"val_{key}") for key in ("accuracy", "f1_macro")})
    trial.set_user_attr("headline", str(metrics.get("headline", ""))[:500])
    trial.set_user_attr("seconds", round(time.perf_counter() - started, 2))
    return score


def _range(entry: dict[str, Any]):
    from tasks.core.params_spec import SearchRange

    return SearchRange(**entry)
