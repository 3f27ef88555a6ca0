"""The sweep's pruning channel (docs/sweep.md): rank 0 of a trial's train stage reports each epoch's validation
score to the trial in the study, and stops the run when the study's pruner says so. The trial is named by an
environment variable the sweep sets, never a param: the channel is no DVC dependency, and a stage run without it
(`torchship run`, plain `dvc repro`) reports nothing. A pruned stage fails, so DVC records and caches no output of it.
Single runs only: cross-validated members early-stop on their own folds, whose epochs are no common scale."""
from __future__ import annotations

import json
import os

from tasks.core.errors import TorchshipError

SWEEP_TRIAL_ENV = "TORCHSHIP_SWEEP_TRIAL"   # JSON: storage (no password), study, trial_id, metric, pruner settings
PRUNED = "pruned by the sweep"              # the stage's failure says this: the sweep records the trial as pruned
TEACHER = "train"                           # the job whose epochs are reported (not distill's student)


class Pruned(TorchshipError):
    """The study's pruner stopped this trial's training."""


def make_pruner(name: str, startup_trials: int, warmup_epochs: int):
    """The study's pruner (Optuna keeps none in the storage: each process builds the same one)."""
    from optuna.pruners import MedianPruner, NopPruner

    return NopPruner() if name == "none" else MedianPruner(n_startup_trials=startup_trials,
                                                           n_warmup_steps=warmup_epochs)


class EpochReporter:
    """Reports one trial's epochs; `report` raises Pruned when the trial should stop."""

    def __init__(self, spec: dict):
        import optuna

        self.metric = spec["metric"]
        study = optuna.load_study(study_name=spec["study"], storage=spec["storage"],
                                  pruner=make_pruner(spec["pruner"], spec["startup_trials"], spec["warmup_epochs"]))
        self.trial = optuna.trial.Trial(study, spec["trial_id"])

    def report(self, record: dict) -> None:
        value, epoch = record[f"val_{self.metric}"], record["epoch"]
        self.trial.report(value, step=epoch)
        if self.trial.should_prune():
            raise Pruned(f"{PRUNED} at epoch {epoch}: validation {self.metric} {value:.4f} is below the median of "
                         "the study's earlier trials at that epoch")


def epoch_reporter(stage: str, rank: int, single_run: bool) -> EpochReporter | None:
    """The reporter for the teacher's rank 0 in a sweep trial; None elsewhere."""
    spec = os.environ.get(SWEEP_TRIAL_ENV)
    if not spec or rank != 0 or stage != TEACHER or not single_run:
        return None
    return EpochReporter(json.loads(spec))
