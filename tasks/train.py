"""train: fit the classifier under torchrun (DDP over gloo on CPU, nccl on CUDA), checkpointing each epoch.

DVC stage: `python -m tasks.train` relaunches itself under `torchrun` with train.nproc processes.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from models import FeatureLayout, build_model
from tasks import layout
from tasks.artifacts import write_atomic, write_json_atomic
from tasks.config import Params, TrainParams
from tasks.contract import Schema, encode_features, encode_target, load_schema
from tasks.errors import TorchshipError
from tasks.metrics import classification_metrics

log = logging.getLogger("torchship.train")


@dataclass
class Split:
    features: torch.Tensor   # (N, F) float32 raw encoded rows
    labels: torch.Tensor     # (N,) int64 class indices


def fit_layout(features: np.ndarray, schema: Schema) -> FeatureLayout:
    """Numeric mean/std and category counts from the training split only."""
    numeric = [j for j, f in enumerate(schema.features) if f.kind == "numeric"]
    categorical = [j for j, f in enumerate(schema.features) if f.kind == "categorical"]
    values = features[:, numeric].astype(np.float64)
    mean = np.nan_to_num(np.nanmean(values, axis=0)) if numeric else np.zeros(0)
    std = np.nan_to_num(np.nanstd(values, axis=0), nan=1.0) if numeric else np.zeros(0)
    std = np.where(std < 1e-8, 1.0, std)
    return FeatureLayout(numeric_index=numeric, categorical_index=categorical,
                         cardinalities=[len(schema.features[j].categories) for j in categorical],
                         numeric_mean=[float(v) for v in mean], numeric_std=[float(v) for v in std],
                         n_classes=len(schema.classes))


def model_spec(params: TrainParams) -> dict:
    """Constructor arguments saved beside the weights so export can rebuild the model."""
    return {"name": params.model, "kwargs": {"hidden": list(params.hidden), "embedding_dim": params.embedding_dim,
                                             "dropout": params.dropout}}


def class_weights(labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Balanced weights n / (k * count), so rare classes count as much as common ones."""
    counts = torch.bincount(labels, minlength=n_classes).clamp(min=1).float()
    return counts.sum() / (n_classes * counts)


def lr_at(step: int, total: int, warmup: int) -> float:
    """Linear warmup then cosine decay, as a multiplier of the peak rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def predict_logits(model: nn.Module, features: torch.Tensor, batch: int = 8192) -> torch.Tensor:
    model.eval()
    return torch.cat([model(features[i:i + batch]) for i in range(0, len(features), batch)])


def fit(model: nn.Module, train: Split, val: Split, params: TrainParams, rank: int = 0, world: int = 1,
        on_epoch=None, on_step=None) -> tuple[nn.Module, list[dict]]:
    """The training loop: sharded batches sliced from pre-collated tensors, AdamW, warmup+cosine,
    class weights, gradient clipping, early stopping on validation macro-F1. Returns the best model."""
    core = model.module if hasattr(model, "module") else model
    per_rank_batch = max(1, params.batch_size // world)
    shard = len(train.labels) // world
    steps_per_epoch = max(1, math.ceil(shard / per_rank_batch))
    total_steps = steps_per_epoch * params.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr, weight_decay=params.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_at(s, total_steps, int(params.warmup_fraction * total_steps)))
    loss_fn = nn.CrossEntropyLoss(weight=class_weights(train.labels, core.body[-1].out_features))
    generator = torch.Generator().manual_seed(params.seed)
    history, best, best_state, stale = [], -1.0, None, 0
    for epoch in range(params.epochs):
        model.train()
        started = time.perf_counter()
        # Shuffle once per epoch, then take contiguous slices: no per-batch gather on the hot path.
        order = torch.randperm(len(train.labels), generator=generator)[rank * shard:(rank + 1) * shard]
        features, labels = train.features[order], train.labels[order]
        loss_sum = torch.zeros(())
        for step in range(steps_per_epoch):
            batch = slice(step * per_rank_batch, (step + 1) * per_rank_batch)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(features[batch]), labels[batch])
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
            optimizer.step()
            scheduler.step()
            loss_sum += loss.detach()
            if on_step:
                on_step(epoch, step, steps_per_epoch)
        if world > 1:
            dist.all_reduce(loss_sum)
        seconds = time.perf_counter() - started
        logits = predict_logits(core, val.features)
        scores = classification_metrics(val.labels.numpy(), logits.argmax(1).numpy(), core.body[-1].out_features)
        record = {"epoch": epoch + 1, "train_loss": float(loss_sum) / (steps_per_epoch * world),
                  "val_loss": float(nn.functional.cross_entropy(logits, val.labels)),
                  "val_accuracy": scores["accuracy"], "val_f1_macro": scores["f1_macro"],
                  "samples_per_s": shard * world / seconds, "lr": scheduler.get_last_lr()[0]}
        history.append(record)
        if on_epoch:
            on_epoch(record, core, optimizer)
        if record["val_f1_macro"] > best:
            best, best_state, stale = record["val_f1_macro"], copy.deepcopy(core.state_dict()), 0
        else:
            stale += 1
            if stale >= params.patience:
                break
    core.load_state_dict(best_state)
    return core, history


def load_split(path, schema: Schema) -> Split:
    frame = pd.read_parquet(path)
    return Split(torch.from_numpy(encode_features(frame, schema)),
                 torch.from_numpy(encode_target(frame[schema.target], schema)))


def launch(params: Params) -> None:
    """Re-run this module under torchrun; a worker's own error message is what the user sees."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={params.train.nproc}", "-m", "tasks.train"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(params.train)),
           "PYTHONUNBUFFERED": "1"}
    code = subprocess.call(command, env=env)
    if code != 0:
        raise TorchshipError(f"torchrun exited with code {code}: a training process failed (its message is above).")


def threads_per_process(params: TrainParams) -> int:
    return params.threads or max(1, (os.cpu_count() or 1) // params.nproc)


def worker(params: Params) -> None:
    """One torchrun process: set up the process group, train, and (rank 0) write and log."""
    from tasks.train_report import report_training

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(params.train.seed)
        torch.set_num_threads(threads_per_process(params.train))
        schema = load_schema(layout.SCHEMA)
        train, val = load_split(layout.TRAIN_SPLIT, schema), load_split(layout.VAL_SPLIT, schema)
        feature_layout = fit_layout(train.features.numpy(), schema)
        spec = model_spec(params.train)
        model = build_model(spec["name"], feature_layout, **spec["kwargs"])
        if world > 1:
            model = nn.parallel.DistributedDataParallel(model)
        progress = TrainingProgress(params.train.epochs) if rank == 0 else None
        best, history = fit(model, train, val, params.train, rank, world,
                            on_step=progress.step if progress else None,
                            on_epoch=progress.epoch if progress else None)
        if progress:
            progress.close()
        if rank == 0:
            checkpoint = {"state_dict": best.state_dict(), "layout": feature_layout.to_dict(), "model": spec,
                          "classes": list(schema.classes)}
            write_atomic(layout.MODEL_WEIGHTS, lambda tmp: torch.save(checkpoint, tmp))
            report_training(params, best, val, history, schema, backend, world)
    finally:
        dist.destroy_process_group()


class TrainingProgress:
    """A rich progress bar on rank 0: epoch, step, loss, validation F1."""

    def __init__(self, epochs: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("train epoch {task.fields[epoch]}/" + str(epochs)), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[note]}"), TimeRemainingColumn(),
                            transient=False)
        self.task = self.bar.add_task("train", total=None, epoch=1, note="")
        self.bar.start()

    def step(self, epoch: int, step: int, steps: int) -> None:
        if step % 20 == 0 or step == steps - 1:
            self.bar.update(self.task, total=steps, completed=step + 1, epoch=epoch + 1)

    def epoch(self, record: dict, model, optimizer) -> None:
        self.bar.update(self.task, note=f"loss {record['train_loss']:.4f}  val f1 {record['val_f1_macro']:.4f}  "
                                        f"{record['samples_per_s']:,.0f} samples/s")
        log.info("epoch %d: train loss %.4f, val loss %.4f, val acc %.4f, val f1 %.4f", record["epoch"],
                 record["train_loss"], record["val_loss"], record["val_accuracy"], record["val_f1_macro"])

    def close(self) -> None:
        self.bar.stop()


def run(params: Params) -> None:
    if "LOCAL_RANK" in os.environ:
        worker(params)
    else:
        launch(params)


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("train", run)
