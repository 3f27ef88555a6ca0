"""One torchrun training job, teacher (train stage) or student (distill): launch, worker (one run, or the folds of
cross-validation); why a job failed is tasks/training/failure.py's."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import resource
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from models import build_model
from tasks.core import paths
from tasks.core.artifacts import sha256_file
from tasks.core.params_spec import Params, PretrainedParams, TrainParams
from tasks.core.schema_spec import Schema, load_schema
from tasks.modalities import modality_named, modality_of
from tasks.training import checkpoint
from tasks.training.adapt import FittedTraining
from tasks.training.backbone import keep_frozen_in_eval
from tasks.training.batches import BatchPlan, plan_batches
from tasks.training.calibration import calibrate_single
from tasks.training.collectives import all_reduce
from tasks.training.crossval import (
    StartFold,
    candidates_for,
    cross_validate,
    cross_validation_rows,
    finish_cross_validation,
)
from tasks.training.decision import fit_threshold
from tasks.training.distributed import Runtime, broadcast_state, init_runtime, wrap_model
from tasks.training.failure import injected_fault
from tasks.training.loop import STOP_ON_F1, Split, Trainer, predict_logits
from tasks.training.pretrained import load_pretrained
from tasks.training.pruning import epoch_reporter
from tasks.training.report import TrainingProgress, report_training
from tasks.training.timeline import Timeline
from tasks.training.weights import load_trained, save_trained

log = logging.getLogger("torchship.train")


@dataclass(frozen=True)
class TrainingJob:
    """What one torchrun job trains and where it writes: the teacher (train stage) or the distilled
    student (compress stage). Both go through the same worker, trainer, checkpoints and report."""

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
    fitted: FittedTraining | None = None   # how `train` was fitted to the table, for the report
    balanced: bool = True           # class-balanced loss weights (the bless metric is macro-F1: balances_classes)
    stop_on: str = STOP_ON_F1       # what early stopping judges (cross-validated members: STOP_ON_LOSS)
    augment: Any = None             # the modality's label-safe augmentation settings (images), or None
    modality: str | None = None     # whose augmenter applies `augment`
    pretrained: PretrainedParams | None = None   # weights to start from (the teacher's train.pretrained)


def split_rows(path: Path) -> int:
    """Rows of a prepared split, from the Parquet footer (no data read)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def run_fingerprint(params: TrainParams, identity: tuple[str, ...] = ()) -> str:
    """Checkpoints resume only a run with the same training params and the same data."""
    # loader_workers: another batch source gives the same batches, so it resumes the same run
    relevant = params.model_dump(exclude={"checkpoint_every", "max_restarts", "collective_timeout_s", "threads",
                                          "loader_workers"})
    digest = hashlib.sha256(json.dumps([relevant, list(identity)], sort_keys=True).encode())
    for path in (paths.TRAIN_SPLIT, paths.VAL_SPLIT, paths.SCHEMA):
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()[:16]


def job_fingerprint(job: TrainingJob) -> str:
    """The job's run identity for its checkpoints (another loss is another run; the balanced default keeps the
    fingerprints it always had)."""
    identity = job.identity if job.balanced else (*job.identity, "unweighted classes")
    if job.augment is not None:   # another augmentation is another run
        identity = (*identity, f"augment {job.augment.model_dump_json()}")
    return run_fingerprint(job.train, identity)


def load_split(path, schema: Schema, device: torch.device) -> Split:
    """A prepared split as tensors on `device`, read by its modality (encoded rows (N, F) float32, images
    (N, H, W, C) uint8, ...)."""
    split = modality_of(schema).read_split(path, schema)
    return Split(torch.from_numpy(np.ascontiguousarray(split.inputs)).to(device),
                 torch.from_numpy(split.labels).to(device))


def threads_per_process(params: TrainParams) -> int:
    return params.threads or max(1, (os.cpu_count() or 1) // params.nproc)


def load_training_splits(settings: TrainParams, schema: Schema, device: torch.device) -> tuple[Split, Split, BatchPlan]:
    """(train, val, where training batches come from): val on `device`; train there too, or in host memory for a
    DataLoader (images whose split would crowd the GPU, or `train.loader_workers`)."""
    val = load_split(paths.VAL_SPLIT, schema, device)
    train = load_split(paths.TRAIN_SPLIT, schema, torch.device("cpu"))
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None   # with val already there
    plan = plan_batches(settings.loader_workers, modality_of(schema).batch_loader,
                        train.features.nelement() * train.features.element_size(), device.type, free,
                        max(1, (os.cpu_count() or 1) // settings.nproc))
    return (train.to(device) if plan.workers == 0 else train), val, plan


def teacher_logits(path: Path, features: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The trained teacher's logits on the given rows, computed on `device`, beside the rows: the student's soft
    targets."""
    teacher, _ = load_trained(path)
    return predict_logits(teacher.to(device), features)


class JobTrainer(Trainer):
    """The trainer inside a torchrun worker: resumes from and writes the job's checkpoints, shows a progress
    bar on rank 0, and fires the reliability tests' injected fault."""

    def __init__(self, job: TrainingJob, runtime: Runtime, n_classes: int):
        super().__init__(job.train, n_classes, runtime.rank, runtime.world, runtime.precision, job.soft_targets,
                         job.balanced, job.stop_on)
        self.folder, self.fingerprint = job.checkpoints, job_fingerprint(job)
        self.fault = injected_fault(runtime.rank)
        self.progress = TrainingProgress(job.train.epochs, job.stage) if runtime.rank == 0 else None
        self.sweep = epoch_reporter(job.stage, runtime.rank, job.stop_on == STOP_ON_F1)   # a sweep trial's pruning

    def resume(self) -> None:
        """Continue from the newest intact checkpoint of this run (params + data), or forget other runs'. Rank 0
        reads it and sends it to the others: on another machine, a rank has no copy of rank 0's disk."""
        saved = checkpoint.load_latest(self.folder, self.fingerprint) if self.rank == 0 else None
        if self.rank == 0 and saved is None:
            checkpoint.clear(self.folder)
        # A collective: no rank starts before rank 0 has cleared stale checkpoints.
        saved = broadcast_state(saved, self.rank, self.world)
        if saved is not None:
            self.load_checkpoint_state(saved)

    def checkpoint(self) -> None:
        saved = self.checkpoint_state()  # a collective: every rank gathers, rank 0 writes
        if self.rank == 0:
            checkpoint.save_checkpoint(self.folder, self.state.global_step, saved, self.fingerprint)

    def before_step(self) -> None:
        if self.fault:
            self.fault(self.state.global_step)

    def after_step(self, step: int, steps: int) -> None:
        if self.progress:
            self.progress.step(self.state.epoch, step, steps)

    def after_epoch(self, record: dict) -> None:
        if self.progress:
            self.progress.epoch(record)
        if self.sweep:
            self.sweep.report(record)

    def close(self) -> None:
        if self.progress:
            self.progress.close()


def start_trainer(job: TrainingJob, runtime: Runtime, n_classes: int, model: nn.Module, train: Split,
                  val: Split, loader_workers: int = 0) -> JobTrainer:
    """The job's trainer on `model` (pretrained weights loaded, wrapped for DDP/FSDP, compiled if asked; images
    augmented, from a DataLoader with `loader_workers` processes if not 0), set up and resumed."""
    frozen = job.pretrained is not None and job.pretrained.path and job.pretrained.freeze == "backbone"
    if job.pretrained is not None and job.pretrained.path:
        loaded = load_pretrained(model, job.pretrained)
        if runtime.rank == 0:
            log.info("%s: %d pretrained tensors loaded from %s (%d fresh: %s)", job.stage, len(loaded["loaded"]),
                     job.pretrained.path, len(loaded["fresh"]), ", ".join(loaded["fresh"][:6]))
    if runtime.device.type == "cuda" and train.features.dtype == torch.uint8:   # images: NHWC kernels pay on CUDA
        model = model.to(memory_format=torch.channels_last)
    model = wrap_model(model, runtime)
    trainer = JobTrainer(job, runtime, n_classes)
    if job.augment is not None:
        trainer.augment = modality_named(job.modality).augmenter(job.augment, job.train.seed)
    trainer.loader_workers = loader_workers
    if frozen:
        trainer.frozen_in_eval = keep_frozen_in_eval
    trainer.setup(torch.compile(model, mode=job.train.compile_mode) if job.train.compile else model, train, val)
    trainer.resume()
    return trainer


def fold_starter(job: TrainingJob, runtime: Runtime, n_classes: int) -> StartFold:
    """Each cross-validation fold as a job of its own: its settings, a progress line naming it, and its own
    checkpoint folder and fingerprint, so a re-run resumes the fold it stopped in and skips finished ones."""
    def start(settings: TrainParams, tag: str, model: nn.Module, train: Split, val: Split, stop_on: str) -> JobTrainer:
        fold = replace(job, train=settings, stage=f"{job.stage} {tag}", identity=(*job.identity, tag, stop_on),
                       checkpoints=job.checkpoints / re.sub(r"\W+", "-", tag), stop_on=stop_on)
        return start_trainer(fold, runtime, n_classes, model, train, val)

    return start


def worker(params: Params, job: TrainingJob, inline: bool = False) -> None:
    """One rank (a torchrun process, or the stage's own process `inline`): join the group, build the model, resume
    or start, train (one run, or the folds of cross-validation below train.cv_max_rows), and (rank 0) save the best
    weights and report."""
    settings, spec, fitted, summary, calibration, logits = job.train, job.spec, job.fitted, None, None, None
    timeline = Timeline()
    timeline.mark("imported")
    runtime = init_runtime(settings, inline)
    timeline.mark("process_group")
    try:
        torch.manual_seed(settings.seed)
        torch.set_num_threads(threads_per_process(settings))
        if runtime.rank == 0 and runtime.precision_note:
            log.warning("precision: %s", runtime.precision_note)
        for note in runtime.notes if runtime.rank == 0 else ():
            log.info("%s", note)
        schema = load_schema(paths.SCHEMA)
        n_classes = len(schema.classes)
        train, val, batches = load_training_splits(settings, schema, runtime.device)
        if batches.note:
            runtime = replace(runtime, notes=(*runtime.notes, batches.note))   # metrics.json "notes"
            if runtime.rank == 0:
                log.info("%s", batches.note)
        cross_validated = fitted is not None and fitted.folds > 1
        if cross_validated:   # members early-stop on inner splits: the validation rows train too
            train = cross_validation_rows(train, val)
        if job.teacher is not None:
            train.soft = teacher_logits(job.teacher, train.features, runtime.device)
        layout = modality_of(schema).fit_layout(train.features.cpu().numpy(), schema)
        timeline.mark("loaded")
        if cross_validated:
            chosen, runs = cross_validate(candidates_for(settings, fitted), train, layout, n_classes, fitted.folds,
                                          settings.seed, fold_starter(job, runtime, n_classes), runtime.rank == 0)
            history, settings = chosen.history, chosen.candidate.settings
        else:
            trainer = start_trainer(job, runtime, n_classes, build_model(spec["name"], layout, **spec["kwargs"]),
                                    train, val, batches.workers)
            state = trainer.train()
            trainer.close()
            history = state.history
        peak_rss_mb = summed_peak_rss_mb()
        timeline.mark("trained")
        if runtime.rank == 0:
            if cross_validated:
                best, spec, fitted, summary = finish_cross_validation(chosen, runs, layout, fitted,
                                                                      train.labels.cpu().numpy(), params.bless.metric,
                                                                      job.balanced)
                decision = summary["decision"]
            else:
                best = build_model(spec["name"], layout, **spec["kwargs"]).to(runtime.device)
                best.load_state_dict(state.best_state)
                best, spec, calibration = calibrate_single(best, spec, val.features, val.labels.cpu().numpy())
                logits = predict_logits(best, val.features).cpu()   # the served model's, once: decision and report
                decision = validation_decision(logits, val, params.bless.metric)   # on the calibrated probabilities
            if job.teacher is not None:
                decision = None   # a student is served with its teacher's rule (compress exports it so)
            best = best.cpu().eval()
            save_trained(job.weights, best, layout, spec, schema.classes, modality_of(schema).name,
                         decision and decision["threshold"])
            timeline.mark("calibrated")
            report_training(params, best, Split(val.features.cpu(), val.labels.cpu()), history, schema, runtime,
                            peak_rss_mb=peak_rss_mb, folder=job.folder, stage=job.stage, train_params=settings,
                            fitted=fitted, cross_validation=summary, calibration=calibration, decision=decision,
                            logits=logits, peak_device_memory_mb=peak_device_memory_mb(runtime.device),
                            timeline=timeline)
    finally:
        dist.destroy_process_group()


def peak_device_memory_mb(device: torch.device) -> float | None:
    """This rank's peak GPU memory held by tensors (torch.cuda.max_memory_allocated); None on the CPU."""
    return torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None


def validation_decision(logits: torch.Tensor, val: Split, metric: str) -> dict | None:
    """A single model's decision rule, fitted on its (N, C) `logits` of the validation split (binary targets; None
    for more classes)."""
    probabilities = torch.softmax(logits.cpu(), 1).numpy()
    return fit_threshold(probabilities, val.labels.cpu().numpy(), metric, "validation")


def summed_peak_rss_mb() -> float:
    """Peak resident memory summed over ranks (a collective: every rank takes part)."""
    return float(all_reduce(torch.tensor([own_peak_rss_mb()], dtype=torch.float64)))


def own_peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
