"""How a training job's ranks run: under torchrun (its processes, per node), or, for a job of one process that
torchrun would not restart, in the calling stage's own process. Either way each rank is tasks/training/job.py's
`worker`."""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tasks.core.env import COMPILE_DISABLE_ENV, LOCAL_RANK_ENV, OMP_THREADS_ENV, STAGE_STARTED_ENV, UNBUFFERED, kept
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params, TrainParams
from tasks.core.procs import Child, exit_without_teardown, running, tee_lines
from tasks.training.distributed import check_processes_fit, torchrun_command
from tasks.training.failure import describe_failure
from tasks.training.job import TrainingJob, job_fingerprint, threads_per_process, worker
from tasks.training.mirror import mirror_for, mirrored
from tasks.training.timeline import stage_started_at

log = logging.getLogger("torchship.train")


def run_job(params: Params, job: TrainingJob) -> None:
    """A worker inside torchrun (it sets LOCAL_RANK); outside it, the job in this process when it has one rank that
    torchrun would not restart, else the launcher."""
    if LOCAL_RANK_ENV in os.environ:
        worker(params, job)
        exit_without_teardown()   # the worker is done: skip unloading torch, MLflow, pandas... (seconds)
    elif runs_inline(job.train):
        train_inline(params, job)
    else:
        launch(job)


def runs_inline(train: TrainParams) -> bool:
    """One process on one node, no restarts: torchrun would add a launcher and a second interpreter importing torch,
    MLflow and scikit-learn again (about 4 CPU-s a job on 2 cores) to run the same single rank."""
    return train.nproc == 1 and train.nnodes == 1 and train.max_restarts == 0


def train_inline(params: Params, job: TrainingJob) -> None:
    """The job's only rank in this process: the same group (of one), trainer, checkpoints and mirror as under
    torchrun, compile off unless asked (as TORCH_COMPILE_DISABLE does for torchrun's workers); a failure of the
    job is a TorchshipError naming it, with its traceback logged, as a failed rank is under torchrun."""
    check_processes_fit(job.train)
    with mirrored(mirror_for(job.stage, job.checkpoints, lambda: job_fingerprint(job))) as end, \
            compile_disabled(not job.train.compile):
        try:
            worker(params, job, inline=True)
        except TorchshipError:
            raise
        except Exception as exc:
            log.exception("%s: the training job failed", job.stage)
            raise TorchshipError(f"the {job.stage} job failed: {type(exc).__name__}: {exc} (its traceback is "
                                 "above)") from exc
        end.succeeded = True


@contextlib.contextmanager
def compile_disabled(disabled: bool) -> Iterator[None]:
    """torch.compile off for the block, as TORCH_COMPILE_DISABLE=1 turns it off for a whole process: the variable
    for a torch._dynamo not imported yet (importing it costs ~1 s), its config where it is."""
    if not disabled:
        yield
        return
    config = sys.modules.get("torch._dynamo.config")
    with kept(COMPILE_DISABLE_ENV), (config.patch(disable=True) if config is not None else contextlib.nullcontext()):
        os.environ[COMPILE_DISABLE_ENV] = "1"
        yield


def launch(job: TrainingJob) -> None:
    """Run the job's module under torchrun; a failure names the rank that failed and its last log lines."""
    check_processes_fit(job.train)   # before torchrun starts: NCCL refuses two ranks on one GPU
    env = {**os.environ, OMP_THREADS_ENV: str(threads_per_process(job.train)), **UNBUFFERED,
           STAGE_STARTED_ENV: str(stage_started_at()), **({} if job.train.compile else {COMPILE_DISABLE_ENV: "1"})}
    # the team topology: checkpoints fetched from and mirrored to the DVC remote (a killed machine's successor resumes)
    with mirrored(mirror_for(job.stage, job.checkpoints, lambda: job_fingerprint(job))) as end:
        # torchrun in a session of its own, held under `running`: a SIGTERM to this stage alone (`kill`, a
        # supervisor, `dvc repro` stopped) stops torchrun and its workers too, instead of leaving them as orphans
        process = subprocess.Popen(torchrun_command(job.train, module=job.module, log_dir=str(job.logs)), env=env,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        tail: collections.deque[str] = collections.deque(maxlen=400)
        reader = threading.Thread(target=tee_lines, args=(process.stderr, tail, sys.stderr), daemon=True)
        reader.start()
        with running([Child("torchrun", process, Path(os.devnull))]):
            code = process.wait()
        reader.join()
        end.succeeded = code == 0
    if code != 0:
        raise TorchshipError(describe_failure(list(tail), code, job.logs, job.train.collective_timeout_s))
