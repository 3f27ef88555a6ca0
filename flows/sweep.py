"""The `sweep` flow (`torchship sweep`, docs/sweep.md): the study opened (trial 0: the champion's configuration),
its template prepared once, workers taking trials until the budget is spent (local processes, or `sweep-trial`
flow runs on the work pool), then the top finishers by validation re-judged by bless on the holdout, in validation
order: the first that passes is the winner, registered, and the canary decides as for any candidate. And
`sweep_trial`, one worker of a study on a work pool."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.canary import record_decision, record_step
from tasks import bless, canary, register
from tasks.config import load_params, parse_params
from tasks.core.errors import ConfigError, TorchshipError
from tasks.core.params_spec import Params
from tasks.core.verdicts import Blessing
from tasks.stages import repro
from tasks.stages.stage_list import pipeline_stages
from tasks.sweep import runs
from tasks.sweep.define import open_study
from tasks.sweep.report import Finalist, SweepSummary, accepts, ranked, shared_work, trial_rows
from tasks.sweep.study import STORAGE_ENV, tally
from tasks.sweep.trial import TRIAL_STAGES
from tasks.sweep.worker import start_local_workers, wait_for, work
from tasks.sweep.workspace import ensure_template, own_code_env
from tasks.workspace.lock import workspace_lock

DEPLOYMENT = "torchship-sweep-trial/sweep-trial"


@task(name="sweep-template")
def prepare_template(definition: dict) -> dict:
    """prepare and validate, once, in the study's template (DVC skips them when an earlier sweep ran them)."""
    record = ensure_template(Path("."), definition["study"], definition["base"])
    get_run_logger().info("template: %s; holdout sha256 %s", record["stages"], record["holdout_sha256"][:12])
    return record


@task(name="sweep-workers", cache_policy=NO_CACHE)
def run_workers(study, definition: dict, workers: int, on_pool: bool) -> list[int]:
    """Trials until the budget is spent: `workers` local processes on this machine, or as many flow runs of the
    sweep-trial deployment on its work pool. Returns their exit codes (0: the budget was spent)."""
    logger = get_run_logger()

    def progress() -> None:
        counts = tally(study.get_trials(deepcopy=False))
        logger.info("trials: %d ended, %d running, %d queued of %d", counts.ended, counts.running, counts.waiting,
                    definition["sweep"]["trials"])

    if on_pool:
        return pool_workers(definition["study"], workers, progress)
    threads = definition["base"]["train"].get("threads") or 1
    return wait_for(start_local_workers(definition["study"], workers, threads), poll_s=10.0, progress=progress)


def pool_workers(name: str, workers: int, progress) -> list[int]:
    """Flow runs of the sweep-trial deployment, waited for; a crashed one (its worker killed) is reported, and the
    others finish its trial."""
    import os

    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    if not os.environ.get(STORAGE_ENV):
        raise ConfigError(f"on a work pool the study must live where every worker reaches it: set ${STORAGE_ENV} "
                          "(a PostgreSQL URL without its password; the password in $PGPASSWORD) here and on the "
                          "workers, or run with --local.")
    started = [run_deployment(DEPLOYMENT, parameters={"study": name}, timeout=0) for _ in range(workers)]
    with get_client(sync_client=True) as client:
        while True:
            states = [client.read_flow_run(run.id).state for run in started]
            if all(state.is_final() for state in states):
                return [0 if state.is_completed() else 1 for state in states]
            progress()
            time.sleep(10.0)


def later_stages() -> list[str]:
    """The stages after train, in dvc.yaml's order: what a finalist needs before bless (baseline reads the holdout:
    the search never ran it)."""
    return [stage for stage in pipeline_stages() if stage not in TRIAL_STAGES]


@task(name="sweep-finalist", task_run_name="trial {finalist.number}")
def judge_finalist(finalist: Finalist, parent_run: str, require_better: bool) -> tuple[Finalist, Blessing | None]:
    """In the trial's folder: the stages after train, then bless against the baselines and the live champion."""
    env = own_code_env(Path("."))
    with contextlib.chdir(finalist.folder):
        try:
            params = load_params()
            for stage in later_stages():
                repro.reproduce(stage, env=env)
            blessing = bless.run(params, parent_run)
        except TorchshipError as exc:
            finalist.verdict = f"not judged: {str(exc).splitlines()[0][:300]}"
            return finalist, None
    finalist.holdout = blessing.candidate_metrics.get(load_metric(finalist.folder))
    finalist.accepted, finalist.verdict = accepts(blessing, require_better)
    get_run_logger().info("trial %d: %s", finalist.number, finalist.verdict)
    return finalist, blessing


def load_metric(folder: str) -> str:
    return load_params(Path(folder) / "params.yaml").bless.metric


@task(name="sweep-register")
def register_winner(winner: Finalist, blessing: Blessing, parent_run: str, study: str) -> str:
    """The winner registered from its folder (its params and dvc.lock are the version's lineage), tagged with the
    study and its optimism; then the canary decides, as for any candidate."""
    tags = {"sweep_study": study, "sweep_trial": str(winner.number), "sweep_optimism": f"{winner.optimism:+.4f}",
            "sweep_validation": f"{winner.validation:.4f}"}
    with contextlib.chdir(winner.folder):
        params = load_params()
        registration = register.run(params, blessing, parent_run, tags)
        report = canary.run(params, parent_run, None, record_step, smoke=True)
        record_decision(report, params.data.registered_model_name())
    return f"{registration.action}; canary: {report.action}"


@task(name="sweep-report", cache_policy=NO_CACHE)
def report_study(params: Params, study, parent_run: str, template: dict, finalists: list[Finalist],
                 winner: Finalist | None, registered: str) -> SweepSummary:
    trials = study.get_trials(deepcopy=False)
    summary = SweepSummary(study.study_name, params.bless.metric, trial_rows(trials), finalists,
                           winner.number if winner else None, registered, shared_work(trials, template))
    runs.log_trials(params.tracking, parent_run, study.study_name, summary.trials)
    notes = runs.log_plots(params.tracking, parent_run, study)
    from tasks.core.tracking import log_run_text

    log_run_text(params.tracking, parent_run, summary.markdown() + "\n" + "; ".join(notes) + "\n", "sweep.md")
    return summary


@flow(name="torchship-sweep", log_prints=True)
def sweep(raw: dict, on_pool: bool = False) -> SweepSummary:
    """The study, its workers, then the finalists judged in validation order until one passes: it is registered
    and the canary decides. `raw`: the params mapping (params.yaml with --set applied; never written back)."""
    params = parse_params(raw)
    study, definition = open_study(params, raw)
    template = prepare_template(definition)
    run_workers(study, definition, params.sweep.workers, on_pool)
    parent_run = runs.study_run(params.tracking, study.study_name)
    with workspace_lock("the sweep's judging", params.retrain.workspace_wait_s):
        judged = [judge_finalist(Finalist(trial.number, trial.value, trial.user_attrs.get("values", {}),
                                          trial.user_attrs["folder"]), parent_run, params.sweep.require_better)
                  for trial in ranked(study.get_trials(deepcopy=False))[:params.sweep.top_k]]
        winner, blessing = next(((f, b) for f, b in judged if f.accepted), (None, None))
        registered = (register_winner(winner, blessing, parent_run, study.study_name) if winner else
                      "nothing registered: no finalist passed")
    finalists = [finalist for finalist, _ in judged]
    return report_study(params, study, parent_run, template, finalists, winner, registered)


@flow(name="torchship-sweep-trial", log_prints=True)
def sweep_trial(study: str) -> int:
    """One worker of `study` on this work pool: trials until its budget is spent (the study's definition, in its
    storage, says the rest); returns how many it ran."""
    import os

    return work(study, Path("."), worker=os.getpid())
