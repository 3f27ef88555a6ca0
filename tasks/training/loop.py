"""The training loop: one straight function, resumable at any step."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from tasks.config import TrainParams
from tasks.core.metrics import classification_metrics


@dataclass
class Split:
    features: torch.Tensor   # (N, F) float32 raw encoded rows
    labels: torch.Tensor     # (N,) int64 class indices
    soft: torch.Tensor | None = None   # (N, C) teacher logits: distillation targets

    def targets(self) -> tuple[torch.Tensor, ...]:
        return (self.labels,) if self.soft is None else (self.labels, self.soft)


@dataclass
class LoopState:
    """Everything needed to continue exactly where a run stopped (tensors and primitives only)."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    loss_sum: float = 0.0
    history: list[dict] = field(default_factory=list)
    best: float = -1.0
    best_state: dict | None = None
    stale: int = 0
    accumulation: int = 1   # micro-batches per step; doubles on out-of-memory


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
    return torch.cat([model(features[i:i + batch]).float() for i in range(0, len(features), batch)])


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's shuffle depends only on (seed, epoch), so a resumed run sees the same batches."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def distillation_loss(hard: nn.Module, temperature: float, alpha: float):
    """Hinton et al.: alpha * T^2 * KL(teacher || student at temperature T) + (1 - alpha) * hard-label loss."""
    def loss(logits: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        soft = nn.functional.kl_div(nn.functional.log_softmax(logits.float() / temperature, 1),
                                    nn.functional.log_softmax(teacher / temperature, 1),
                                    log_target=True, reduction="batchmean")
        return alpha * temperature ** 2 * soft + (1 - alpha) * hard(logits, labels)

    return loss


def accumulate(model: nn.Module, loss_fn, features: torch.Tensor, targets: tuple[torch.Tensor, ...], parts: int,
               autocast, scaler, optimizer) -> torch.Tensor:
    """Forward/backward one batch as `parts` micro-batches; gradients equal the whole batch's. Returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    if parts == 1:  # the common case: no chunking, no rescaling on the hot path
        with autocast:
            loss = loss_fn(model(features), *targets)
        (scaler.scale(loss) if scaler.is_enabled() else loss).backward()
        return loss.detach()
    total = torch.zeros((), device=features.device)
    for x, *ys in zip(features.chunk(parts), *(t.chunk(parts) for t in targets)):
        with autocast:
            loss = loss_fn(model(x), *ys) * (len(x) / len(features))
        scaler.scale(loss).backward()
        total += loss.detach().float()
    return total


def fit(model: nn.Module, train: Split, val: Split, params: TrainParams, n_classes: int, rank: int = 0,
        world: int = 1, precision: str = "fp32", resume: dict | None = None,
        save: Callable[[LoopState, torch.optim.Optimizer, object], None] | None = None,
        on_step=None, on_epoch=None, full_state=None, before_step=None, on_oom=None,
        soft_targets: tuple[float, float] | None = None) -> LoopState:
    """Sharded batches sliced from pre-collated tensors, AdamW, warmup+cosine, class weights, gradient
    clipping, early stopping on validation macro-F1; checkpoints through `save` every
    `checkpoint_every` steps and at each epoch end. With `soft_targets` = (temperature, alpha) and
    teacher logits in `train.soft`, the loss is the distillation loss. Returns the final state (best weights inside)."""
    device = train.features.device
    per_rank_batch = max(1, params.batch_size // world)
    shard = len(train.labels) // world
    steps_per_epoch = max(1, math.ceil(shard / per_rank_batch))
    total_steps = steps_per_epoch * params.epochs
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=params.lr, weight_decay=params.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_at(s, total_steps, int(params.warmup_fraction * total_steps)))
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
                if precision != "fp32" else contextlib.nullcontext())
    loss_fn = nn.CrossEntropyLoss(weight=class_weights(train.labels, n_classes).to(device))
    if soft_targets is not None:
        loss_fn = distillation_loss(loss_fn, *soft_targets)
    state = LoopState()
    if resume is not None:
        state = resume["loop"]
        resume["restore"](model, optimizer)
        scheduler.load_state_dict(resume["scheduler"])
        scaler.load_state_dict(resume["scaler"])
        torch.set_rng_state(resume["rng"])
    full_state = full_state or (lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()})
    while state.epoch < params.epochs:
        model.train()
        started = time.perf_counter()
        # Shuffle once per epoch, then contiguous slices: no per-batch gather on the hot path.
        order = epoch_order(len(train.labels), params.seed, state.epoch)[rank * shard:(rank + 1) * shard].to(device)
        features, targets = train.features[order], tuple(t[order] for t in train.targets())
        loss_sum = torch.tensor(state.loss_sum, device=device)
        first_step = state.step_in_epoch
        for step in range(first_step, steps_per_epoch):
            batch = slice(step * per_rank_batch, (step + 1) * per_rank_batch)
            while True:
                try:
                    if before_step:
                        before_step(state.global_step)
                    loss = accumulate(model, loss_fn, features[batch], tuple(t[batch] for t in targets),
                                      state.accumulation, autocast, scaler, optimizer)
                    break
                except torch.OutOfMemoryError:
                    # Same effective batch, half the micro-batch: twice the accumulation steps.
                    if per_rank_batch // (state.accumulation * 2) < 1:
                        raise
                    state.accumulation *= 2
                    on_oom and on_oom(per_rank_batch // state.accumulation, state.accumulation)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            if scaler.is_enabled():
                scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(parameters, params.grad_clip, foreach=True)
            if scaler.is_enabled():
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            loss_sum += loss
            state.global_step += 1
            if on_step:
                on_step(state.epoch, step, steps_per_epoch)
            if save and params.checkpoint_every and state.global_step % params.checkpoint_every == 0 \
                    and step + 1 < steps_per_epoch:
                state.step_in_epoch, state.loss_sum = step + 1, float(loss_sum)
                save(state, optimizer, (scheduler, scaler))
        if world > 1:
            dist.all_reduce(loss_sum)
        seconds = time.perf_counter() - started
        logits = predict_logits(model, val.features)
        scores = classification_metrics(val.labels.cpu().numpy(), logits.argmax(1).cpu().numpy(), n_classes)
        record = {"epoch": state.epoch + 1, "train_loss": float(loss_sum) / (steps_per_epoch * world),
                  "val_loss": float(nn.functional.cross_entropy(logits, val.labels)),
                  "val_accuracy": scores["accuracy"], "val_f1_macro": scores["f1_macro"],
                  "samples_per_s": (steps_per_epoch - first_step) * per_rank_batch * world / seconds,
                  "seconds": seconds,
                  "lr": scheduler.get_last_lr()[0]}
        state.history.append(record)
        if on_epoch:
            on_epoch(record)
        improved = record["val_f1_macro"] > state.best
        best_candidate = full_state(model) if improved else None  # a collective under FSDP: every rank calls
        if improved:
            state.best, state.best_state, state.stale = record["val_f1_macro"], best_candidate, 0
        else:
            state.stale += 1
        state.epoch, state.step_in_epoch, state.loss_sum = state.epoch + 1, 0, 0.0
        if state.stale >= params.patience:
            state.epoch = params.epochs  # early stop; recorded so a resume does not train on
        if save:
            save(state, optimizer, (scheduler, scaler))
    return state


def train_model(model: nn.Module, train: Split, val: Split, params: TrainParams,
                n_classes: int | None = None, soft_targets: tuple[float, float] | None = None
                ) -> tuple[nn.Module, list[dict]]:
    """Single-process convenience (tests, benchmarks): fit without checkpoints, return the best model.
    `n_classes` defaults to the largest training label + 1 (stratified splits hold every class)."""
    state = fit(model, train, val, params, n_classes or int(train.labels.max()) + 1, soft_targets=soft_targets)
    model.load_state_dict(state.best_state)
    return model.eval(), state.history
