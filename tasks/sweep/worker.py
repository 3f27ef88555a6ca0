"""A sweep worker: takes the study's next trial whenever its last one ends (never waiting for a batch), until the
budget is spent. The same loop runs as a local process (`python -m tasks.sweep.worker STUDY`, the embedded
default) and inside a `sweep-trial` flow run on a work pool (the team stack); it needs only the study's name."""
from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

from tasks.core.env import OMP_THREADS_ENV
from tasks.core.procs import Child, start_child
from tasks.sweep.study import (
    STOP,
    WAIT,
    load_study,
    next_move,
    open_storage,
    read_definition,
    settings_of,
    storage_url,
    tally,
    time_left,
)
from tasks.sweep.trial import run_trial
from tasks.sweep.workspace import ensure_template, study_folder


def work(study_name: str, root: Path = Path("."), worker: int = 0, echo=sys.stdout) -> int:
    """Run trials of the study until its budget (trials, time) is spent; returns how many this worker ran. A trial's
    failure is recorded on it and the loop goes on."""
    import optuna
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import fail_stale_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(root)
    definition = read_definition(url, study_name)
    settings = settings_of(definition)
    study = load_study(study_name, open_storage(url, settings), settings, worker)
    ensure_template(root, study_name, definition["base"], echo)
    ran = 0
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            fail_stale_trials(study)   # a dead worker's trial, silent past grace_s: failed and queued again
        move = next_move(tally(study.get_trials(deepcopy=False)), settings.trials, time_left(definition))
        if move == STOP:
            return ran
        if move == WAIT:   # the budget is taken by running trials: they end, or go stale and come back queued
            time.sleep(settings.heartbeat_s)
            continue
        study.optimize(lambda trial: run_trial(trial, definition, root, url, echo), n_trials=1,
                       catch=(Exception,), gc_after_trial=False)
        ran += 1


def start_local_workers(study_name: str, count: int, threads: int, root: Path = Path(".")) -> list[Child]:
    """`count` worker processes on this machine, each with `threads` threads, their output under .sweep/<study>/."""
    env = {**os.environ, OMP_THREADS_ENV: str(threads)}
    folder = study_folder(root, study_name)
    return [start_child(f"sweep worker {i}", [sys.executable, "-m", "tasks.sweep.worker", study_name, str(i)],
                        folder / f"worker-{i}.log", env=env, cwd=root) for i in range(count)]


def wait_for(workers: list[Child], poll_s: float = 1.0, progress=None) -> list[int]:
    """Each worker's exit code once all have ended; `progress()` is called between polls."""
    while any(child.process.poll() is None for child in workers):
        if progress:
            progress()
        time.sleep(poll_s)
    return [child.process.wait() for child in workers]


def main(argv: list[str]) -> None:
    """`python -m tasks.sweep.worker STUDY [WORKER]`: the loop in this folder (a project or its copy)."""
    from tasks.core.env import TELEMETRY_OFF, set_defaults
    from tasks.core.errors import TorchshipError
    from tasks.stages.entry import configure_logging

    configure_logging()
    set_defaults(TELEMETRY_OFF)
    try:
        ran = work(argv[0], Path("."), int(argv[1]) if len(argv) > 1 else 0)
    except TorchshipError as exc:
        print(f"torchship sweep worker failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    print(f"sweep worker: {ran} trial(s) run; the study's budget is spent", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

