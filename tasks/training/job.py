"""One torchrun training job, teacher (train stage) or student (distill): launch, worker, failure report."""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from models import build_model
from tasks.config import Params, TrainParams
from tasks.contract import Schema, encode_features, encode_target, load_schema
from tasks.core import paths
from tasks.core.artifacts import sha256_file
from tasks.core.errors import TorchshipError
from tasks.core.procs import tee_lines
from tasks.training import checkpoint
from tasks.training.distributed import full_state, init_runtime, load_full_state, torchrun_command, wrap_model
from tasks.training.loop import LoopState, Split, fit
from tasks.training.weights import fit_layout, load_trained, save_trained

log = logging.getLogger("torchship.train")


@dataclass(frozen=True)
class TrainingJob:
    """What one torchrun job trains and where it writes: the teacher (train stage) or the distilled
    student (compress stage). Both go through the same worker, loop, checkpoints and report."""

    stage: str                      # MLflow run name and log prefix
    train: TrainParams              # effective training settings
    spec: dict                      # model name + constructor kwargs
    weights: Path
    checkpoints: Path
    folder: Path                    # metrics.json, history.csv, plots/
    logs: Path
    module: str = "tasks.train"     # what torchrun runs in each worker
    identity: tuple[str, ...] = ()  # extra run identity for resuming (teacher hash, distillation params)
    soft_targets: tuple[float, float] | None = None   # (temperature, alpha): train on the teacher's logits
    teacher: Path | None = None


def run_fingerprint(params: TrainParams, identity: tuple[str, ...] = ()) -> str:
    """Checkpoints resume only a run with the same training params and the same data."""
    relevant = params.model_dump(exclude={"checkpoint_every", "max_restarts", "collective_timeout_s", "threads"})
    digest = hashlib.sha256(json.dumps([relevant, list(identity)], sort_keys=True).encode())
    for path in (paths.TRAIN_SPLIT, paths.VAL_SPLIT, paths.SCHEMA):
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()[:16]


def load_split(path, schema: Schema, device: torch.device) -> Split:
    frame = pd.read_parquet(path)
    return Split(torch.from_numpy(encode_features(frame, schema)).to(device),
                 torch.from_numpy(encode_target(frame[schema.target], schema)).to(device))


def threads_per_process(params: TrainParams) -> int:
    return params.threads or max(1, (os.cpu_count() or 1) // params.nproc)


def launch(job: TrainingJob) -> None:
    """Run the job's module under torchrun; a failure names the rank that failed and its last log lines."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(job.train)), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(torchrun_command(job.train, module=job.module, log_dir=str(job.logs)), env=env,
                               stderr=subprocess.PIPE, text=True)
    tail: collections.deque[str] = collections.deque(maxlen=400)
    reader = threading.Thread(target=tee_lines, args=(process.stderr, tail, sys.stderr), daemon=True)
    reader.start()
    code = process.wait()
    reader.join()
    if code != 0:
        raise TorchshipError(describe_failure(list(tail), code, job.logs))


def describe_failure(lines: list[str], code: int, logs_folder: Path = paths.TRAIN_LOGS) -> str:
    """From torchrun's summary: which rank failed first, how, and the last lines it logged."""
    text = "\n".join(lines)
    root = text[text.find("Root Cause"):] if "Root Cause" in text else text
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    how = re.search(r"traceback\s*:\s*(Signal.+)", root) or re.search(r"exitcode\s*:\s*(.+)", root)
    own = [line for line in lines if "failed:" in line and line.startswith("torchship ")]
    logs = sorted(logs_folder.glob(f"**/attempt_*/{rank.group(1) if rank else 0}/*.log"),
                  key=lambda p: p.stat().st_mtime)
    last = [l for l in (logs[-1].read_text(errors="replace").splitlines() if logs else []) if l.strip()][-5:]
    return (f"rank {rank.group(1) if rank else '?'} of the torchrun job failed first: "
            f"{how.group(1).strip() if how else 'unknown cause'} (torchrun exit {code}). " + (f"Its error: {own[0]} " if own else "")
            + (f"Its last log lines: {' | '.join(last)}. " if last else "")
            + f"Re-run to resume from the last checkpoint ({logs_folder.parent / 'checkpoints'}).")


def teacher_logits(path: Path, features: torch.Tensor) -> torch.Tensor:
    """The trained teacher's logits on the given rows: the student's soft targets."""
    from tasks.training.loop import predict_logits

    teacher, _ = load_trained(path)
    return predict_logits(teacher.to(features.device), features)


def worker(params: Params, job: TrainingJob) -> None:
    """One torchrun process: join the group, resume or start, train, and (rank 0) write and log."""
    from tasks.training.report import TrainingProgress, report_training

    settings, spec = job.train, job.spec
    runtime = init_runtime(settings)
    try:
        torch.manual_seed(settings.seed)
        torch.set_num_threads(threads_per_process(settings))
        if runtime.rank == 0 and runtime.precision_note:
            log.warning("precision: %s", runtime.precision_note)
        schema = load_schema(paths.SCHEMA)
        train = load_split(paths.TRAIN_SPLIT, schema, runtime.device)
        val = load_split(paths.VAL_SPLIT, schema, runtime.device)
        if job.teacher is not None:
            train.soft = teacher_logits(job.teacher, train.features)
        feature_layout = fit_layout(train.features.cpu().numpy(), schema)
        model = wrap_model(build_model(spec["name"], feature_layout, **spec["kwargs"]), settings.strategy, runtime)
        if settings.compile:
            model = torch.compile(model)
        fingerprint = run_fingerprint(settings, job.identity)
        resume = checkpoint.load_latest(job.checkpoints, fingerprint)
        if resume is None and runtime.rank == 0:
            checkpoint.clear(job.checkpoints)
        dist.barrier()

        def save(state: LoopState, optimizer, extras) -> None:
            model_state, optimizer_state = full_state(model, optimizer)  # collective: all ranks
            if runtime.rank == 0:
                scheduler, scaler = extras
                checkpoint.save_checkpoint(job.checkpoints, state.global_step, {
                    "loop": asdict(state), "model": model_state, "optimizer": optimizer_state,
                    "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                    "rng": torch.get_rng_state()}, fingerprint)

        progress = TrainingProgress(settings.epochs, job.stage) if runtime.rank == 0 else None

        def on_oom(micro_batch: int, parts: int) -> None:
            log.warning("rank %d: out of memory; micro-batch halved to %d, accumulating %d per step (same "
                        "effective batch)", runtime.rank, micro_batch, parts)

        state = fit(model, train, val, settings, len(schema.classes), runtime.rank, runtime.world,
                    runtime.precision, resume=_resume_hooks(resume), save=save,
                    on_step=progress.step if progress else None, on_epoch=progress.epoch if progress else None,
                    full_state=lambda m: full_state(m)[0], before_step=injected_fault(runtime.rank), on_oom=on_oom,
                    soft_targets=job.soft_targets)
        if progress:
            progress.close()
        # Peak resident memory summed over ranks (a collective: every rank takes part).
        peak_rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=torch.float64)
        dist.all_reduce(peak_rss)
        if runtime.rank == 0:
            best = build_model(spec["name"], feature_layout, **spec["kwargs"])
            best.load_state_dict(state.best_state)
            save_trained(job.weights, best, feature_layout, spec, schema.classes)
            report_training(params, best.eval(), Split(val.features.cpu(), val.labels.cpu()), state.history, schema,
                            runtime, peak_rss_mb=float(peak_rss), folder=job.folder, stage=job.stage,
                            train_params=settings)
    finally:
        dist.destroy_process_group()


def injected_fault(rank: int):
    """TORCHSHIP_FAULT=kind:rank:step makes that rank fail for real at that global step, for the
    reliability tests: `kill` (SIGKILL itself), `hang` (stop answering collectives), `oom` (an
    out-of-memory error once, as CUDA would raise)."""
    spec = os.environ.get("TORCHSHIP_FAULT")
    if not spec:
        return None
    kind, fault_rank, fault_step = spec.split(":")
    fired = []

    def hook(global_step: int) -> None:
        if rank != int(fault_rank) or global_step != int(fault_step) or fired:
            return
        fired.append(True)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            time.sleep(3600)
        elif kind == "oom":
            raise torch.OutOfMemoryError("injected out-of-memory (TORCHSHIP_FAULT)")

    return hook


def _resume_hooks(saved: dict | None) -> dict | None:
    if saved is None:
        return None
    return {"loop": LoopState(**saved["loop"]), "scheduler": saved["scheduler"], "scaler": saved["scaler"],
            "rng": saved["rng"],
            "restore": lambda model, optimizer: load_full_state(model, optimizer, saved["model"], saved["optimizer"])}


def run_job(params: Params, job: TrainingJob) -> None:
    """The launcher outside torchrun; a worker inside it (torchrun sets LOCAL_RANK)."""
    if "LOCAL_RANK" in os.environ:
        worker(params, job)
    else:
        launch(job)
