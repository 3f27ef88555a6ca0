"""The Optuna study: its storage (the team's PostgreSQL, or SQLite under .sweep/), its definition (written once by the
driver into the study itself, so a worker needs only the study's name), and its budget, counted the same way by
every worker.

A worker that dies mid-trial stops the heartbeat its trial sends; once `sweep.grace_s` has passed, the next worker
to look marks it failed and RetryHeartbeatStaleTrialCallback queues a copy (state WAITING), which the next `ask`
takes first. A failed trial the objective recorded (a crash, a gate's refusal: user attr `reason`) counts against
the budget and is not retried; one the heartbeat failed does not count (its copy does)."""
from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tasks.core.errors import ConfigError
from tasks.core.params_spec import SweepParams
from tasks.training.pruning import make_pruner

STORAGE_ENV = "TORCHSHIP_SWEEP_STORAGE"   # a database URL without its password (PGPASSWORD carries that)
SWEEP_DIR = Path(".sweep")                # git-ignored: the local study database and the workspaces
REASON = "reason"                         # user attr of a trial the objective failed, in words
DEFINITION = "definition"                 # study user attr: what the driver decided (JSON-able)
TRIAL, WAIT, STOP = "trial", "wait", "stop"


def storage_url(root: Path = Path(".")) -> str:
    """$TORCHSHIP_SWEEP_STORAGE (the team's database), else SQLite under the project's .sweep/."""
    url = os.environ.get(STORAGE_ENV) or f"sqlite:///{(root / SWEEP_DIR / 'studies.db').resolve()}"
    if urlsplit(url).password:
        raise ConfigError(f"${STORAGE_ENV} holds a password: give the URL without it (postgresql+psycopg2://USER@HOST"
                          ":PORT/DB) and the password in $PGPASSWORD, so it is in no log, flow run or process list.")
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return url


def open_storage(url: str, settings: SweepParams | None = None):
    """The study's RDBStorage; with `settings`, running trials send a heartbeat and a silent one is queued again."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    if settings is None:
        return RDBStorage(url, engine_kwargs=engine)
    with warnings.catch_warnings():   # heartbeats are marked experimental since Optuna 2.9: the feature we rely on
        warnings.simplefilter("ignore", ExperimentalWarning)
        return RDBStorage(url, engine_kwargs=engine, heartbeat_interval=settings.heartbeat_s,
                          grace_period=settings.grace_s,
                          heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3))


def settings_of(definition: dict[str, Any]) -> SweepParams:
    return SweepParams(**definition["sweep"])


def read_definition(url: str, name: str) -> dict[str, Any]:
    """The definition the driver wrote into the study (a worker's only input besides the study's name)."""
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=open_storage(url)).user_attrs[DEFINITION]
    except KeyError:
        raise ConfigError(f"no sweep study named {name!r} in the study storage: start it with `torchship sweep`."
                          ) from None


def sampler_for(settings: SweepParams, worker: int = 0):
    """Multivariate TPE with the constant liar (parallel workers get diverse suggestions); its random start-up
    trials are a third of the study, at least 3, at most 10; each worker seeds its own (same seed, same draws)."""
    from optuna.samplers import TPESampler

    return TPESampler(seed=settings.seed + worker, multivariate=True, constant_liar=True,
                      n_startup_trials=min(10, max(3, settings.trials // 3)))


def pruner_for(settings: SweepParams):
    return make_pruner(settings.pruner, settings.prune_startup_trials, settings.prune_warmup_epochs)


def load_study(name: str, storage, settings: SweepParams, worker: int = 0):
    """The study by name, with this worker's sampler and the study's pruner."""
    import optuna

    return optuna.load_study(study_name=name, storage=storage, sampler=sampler_for(settings, worker),
                             pruner=pruner_for(settings))


def create_study(name: str, storage, settings: SweepParams, definition: dict[str, Any]):
    """Create the study (or open it to resume: its splits must be the same) and write its definition."""
    import optuna

    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                sampler=sampler_for(settings), pruner=pruner_for(settings))
    before = study.user_attrs.get(DEFINITION)
    if before and before["splits"] != definition["splits"]:
        raise ConfigError(f"sweep study {name!r} was made on other splits (data.*, prepare.seed or the fractions "
                          "changed): every trial of a study sees the same rows. Name a new one: "
                          "--set sweep.study=NAME.")
    if before:   # a resume keeps trial 0 and its start; the budget and the rest are this run's
        definition = {**definition, "started": before["started"], "held": before["held"]}
    study.set_user_attr(DEFINITION, json.loads(json.dumps(definition, default=str)))
    return study


def definition_of(study) -> dict[str, Any]:
    return study.user_attrs[DEFINITION]


@dataclass(frozen=True)
class Tally:
    ended: int     # complete, pruned, or failed with a recorded reason
    running: int
    waiting: int   # queued: trial 0, or a dead worker's trial again


def tally(trials) -> Tally:
    from optuna.trial import TrialState

    ended = sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                or (t.state == TrialState.FAIL and REASON in t.user_attrs))
    return Tally(ended, sum(1 for t in trials if t.state == TrialState.RUNNING),
                 sum(1 for t in trials if t.state == TrialState.WAITING))


def next_move(counts: Tally, budget: int, time_left: bool) -> str:
    """TRIAL (ask one), WAIT (the running ones may end or go stale and be queued again), or STOP. Two workers that
    ask at the same moment may start one trial more than the budget (as Optuna's MaxTrialsCallback may)."""
    if not time_left or counts.ended >= budget:
        return STOP
    if counts.waiting or counts.ended + counts.running < budget:
        return TRIAL
    return WAIT if counts.running else STOP


def time_left(definition: dict[str, Any], now: float | None = None) -> bool:
    minutes = definition.get("timeout_minutes") or 0
    return not minutes or (now or time.time()) < definition["started"] + 60 * minutes
