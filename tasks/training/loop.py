"""The training recipe: `Trainer` (setup, train, checkpoint_state, load_checkpoint_state), resumable at any step,
and the small pieces it is made of (schedule, class weights, distillation loss, micro-batching)."""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from tasks.core.errors import TorchshipError
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import TrainParams
from tasks.training.adapt import fit_training, fitted_settings
from tasks.training.batches import EpochWalk, batch_source
from tasks.training.collectives import all_reduce
from tasks.training.distributed import full_state, load_full_state

log = logging.getLogger("torchship.train")

# What early stopping keeps the best epoch of: validation macro-F1 (a single run, judged on it), or validation
# log-loss (cross-validated members, whose few dozen inner-validation rows make F1 a step function that saturates
# at the first epoch that gets them all right: tasks/training/crossval.py).
STOP_ON_F1, STOP_ON_LOSS = "f1_macro", "loss"


class TrainingDiverged(TorchshipError):
    """The loss or the validation logits stopped being finite: training stops there, and that epoch is never kept."""


@dataclass
class Split:
    features: torch.Tensor   # (N, F) float32 raw encoded rows
    labels: torch.Tensor     # (N,) int64 class indices
    soft: torch.Tensor | None = None   # (N, C) teacher logits: distillation targets

    def targets(self) -> tuple[torch.Tensor, ...]:
        return (self.labels,) if self.soft is None else (self.labels, self.soft)

    def to(self, device: torch.device) -> Split:
        """The split's tensors on `device`."""
        return Split(*(None if t is None else t.to(device) for t in (self.features, self.labels, self.soft)))


@dataclass
class LoopState:
    """Everything needed to continue exactly where a run stopped (tensors and primitives only)."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    loss_sum: float = 0.0
    history: list[dict] = field(default_factory=list)
    best: float = -math.inf          # the best early-stopping score so far (higher is better)
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
def predict_logits(model: nn.Module, features: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    """(N, C) float32 logits in eval mode on the rows' device, `batch` rows at a time, each moved to the model's
    device (a split in host memory): an FT-Transformer's activations for 8,192 rows cost ~230 MB more peak memory
    than for 1,024, and are no faster."""
    model.eval()
    device = next(model.parameters(), features).device
    return torch.cat([model(features[i:i + batch].to(device)).float().to(features.device)
                      for i in range(0, len(features), batch)])


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


class Trainer:
    """One training run, torchtune-recipe style: `setup` the model and data, `train`, and `checkpoint_state` /
    `load_checkpoint_state` at any step (writing them to disk is the `checkpoint` hook's job). Sharded batches
    (tasks/training/batches.py: slices of a split on the device, or a DataLoader's workers), AdamW, warmup+cosine,
    class weights (`balanced`), gradient clipping, early stopping on validation macro-F1 or log-loss (`stop_on`;
    best weights kept); with `soft_targets` = (temperature, alpha) and teacher logits in `train.soft`, the
    distillation loss.

    A subclass persists checkpoints and shows progress by overriding the hooks `checkpoint`, `before_step`,
    `after_step` and `after_epoch`; here they do nothing, which is what single-process training needs."""

    def __init__(self, settings: TrainParams, n_classes: int, rank: int = 0, world: int = 1,
                 precision: str = "fp32", soft_targets: tuple[float, float] | None = None, balanced: bool = True,
                 stop_on: str = STOP_ON_F1):
        self.settings, self.n_classes, self.rank, self.world = settings, n_classes, rank, world
        self.precision, self.soft_targets = precision, soft_targets   # precision: already resolved (fp32/bf16/fp16)
        self.balanced = balanced   # class-balanced loss weights, else every row counts the same
        self.stop_on = stop_on     # the validation figure early stopping keeps the best of (STOP_ON_*)
        self.state = LoopState()
        self.augment = None         # (batch, epoch, step) -> batch: label-safe augmentation (the modality's)
        self.loader_workers = 0     # N: a DataLoader's N processes gather batches from a host split (batches.py)
        self.frozen_in_eval = None  # model -> None after model.train(): a frozen backbone stays in eval mode

    def setup(self, model: nn.Module, train: Split, val: Split) -> None:
        """Optimizer, schedule, grad scaler, autocast and loss for this model and data; the shard sizes and where
        each step's batch comes from. The model's device trains (a DataLoader's split stays in host memory)."""
        settings, device = self.settings, next(model.parameters(), train.features).device
        self.model, self.train_split, self.val_split, self.device = model, train, val, device
        self.per_rank_batch = max(1, settings.batch_size // self.world)
        self.shard = len(train.labels) // self.world
        self.steps_per_epoch = max(1, math.ceil(self.shard / self.per_rank_batch))
        total_steps = self.steps_per_epoch * settings.epochs
        walk = EpochWalk(settings.seed, self.rank, self.shard, self.per_rank_batch, self.steps_per_epoch)
        self.batches = batch_source(train.features, train.targets(), walk, self.augment, self.loader_workers, device)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        # fused: one kernel for all parameters instead of a loop over them (optimizer step ~4x faster on CPU).
        self.optimizer = torch.optim.AdamW(self.parameters, lr=settings.lr, weight_decay=settings.weight_decay,
                                           fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_at(s, total_steps, int(settings.warmup_fraction * total_steps)))
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.autocast = (torch.autocast(device.type,
                                        dtype=torch.bfloat16 if self.precision == "bf16" else torch.float16)
                         if self.precision != "fp32" else contextlib.nullcontext())
        weights = class_weights(train.labels, self.n_classes).to(device) if self.balanced else None
        self.loss_fn = nn.CrossEntropyLoss(weight=weights)
        if self.soft_targets is not None:
            self.loss_fn = distillation_loss(self.loss_fn, *self.soft_targets)

    def checkpoint_state(self) -> dict:
        """The run so far as tensors and primitives (loads with weights_only=True). A collective under FSDP:
        every rank calls it; rank 0 gets the full (unsharded) state."""
        model_state, optimizer_state = full_state(self.model, self.optimizer)
        return {"loop": asdict(self.state), "model": model_state, "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "rng": torch.get_rng_state()}

    def load_checkpoint_state(self, saved: dict) -> None:
        """After `setup`: continue from what `checkpoint_state` returned (same weights, optimizer moments,
        schedule position, RNG and loop state, mid-epoch included)."""
        self.state = LoopState(**saved["loop"])
        load_full_state(self.model, self.optimizer, saved["model"], saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        torch.set_rng_state(saved["rng"])

    def train(self) -> LoopState:
        """Train from wherever `state` stands to the last epoch or an early stop; returns the final state."""
        settings, state, model, optimizer = self.settings, self.state, self.model, self.optimizer
        scheduler, scaler, parameters = self.scheduler, self.scaler, self.parameters
        steps, batch_size = self.steps_per_epoch, self.per_rank_batch
        while state.epoch < settings.epochs:
            model.train()
            if self.frozen_in_eval is not None:
                self.frozen_in_eval(model)
            started = time.perf_counter()
            loss_sum = torch.tensor(state.loss_sum, device=self.device)
            first_step = state.step_in_epoch
            self.bad_step, self.bad_loss = torch.tensor(-1, device=self.device), torch.tensor(0.0, device=self.device)
            for step, inputs, targets in self.batches.epoch(state.epoch, first_step):
                loss = self._gradients(inputs, targets)
                if not scaler.is_enabled():   # fp16's scaler skips a step whose gradients overflowed by itself
                    self._watch(loss, step)
                if scaler.is_enabled():
                    scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(parameters, settings.grad_clip, foreach=True)
                if scaler.is_enabled():
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                scheduler.step()
                loss_sum += loss
                state.global_step += 1
                self.after_step(step, steps)
                if settings.checkpoint_every and state.global_step % settings.checkpoint_every == 0 \
                        and step + 1 < steps:
                    state.step_in_epoch, state.loss_sum = step + 1, float(loss_sum)
                    self._stop_if_diverged(steps)   # never a checkpoint of diverged weights
                    self.checkpoint()
            self._stop_if_diverged(steps)
            if self.world > 1:
                loss_sum = all_reduce(loss_sum)
            seconds = time.perf_counter() - started
            self._end_epoch(float(loss_sum), (steps - first_step) * batch_size * self.world / seconds, seconds)
            self.checkpoint()
        self.batches.close()   # a DataLoader's workers end with the training
        return state

    def _gradients(self, features: torch.Tensor, targets: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """One batch's gradients and loss; out of memory halves the micro-batch (same effective batch) and retries."""
        while True:
            try:
                self.before_step()
                return accumulate(self.model, self.loss_fn, features, targets, self.state.accumulation,
                                  self.autocast, self.scaler, self.optimizer)
            except torch.OutOfMemoryError:
                if self.per_rank_batch // (self.state.accumulation * 2) < 1:
                    raise
                self.state.accumulation *= 2
                log.warning("rank %d: out of memory; micro-batch halved to %d, accumulating %d per step (same "
                            "effective batch)", self.rank, self.per_rank_batch // self.state.accumulation,
                            self.state.accumulation)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()

    def _watch(self, loss: torch.Tensor, step: int) -> None:
        """Mark the epoch's first non-finite loss where it is (no device sync per step: read at each checkpoint and at
        the epoch's end)."""
        first = (self.bad_step < 0) & ~torch.isfinite(loss)
        self.bad_step = torch.where(first, step, self.bad_step)
        self.bad_loss = torch.where(first, loss.float(), self.bad_loss)

    def _stop_if_diverged(self, steps: int) -> None:
        """TrainingDiverged naming the epoch and step of the first non-finite loss, if there was one."""
        if int(self.bad_step) >= 0:
            raise TrainingDiverged(
                f"training diverged on rank {self.rank}: the loss was {float(self.bad_loss)} at epoch "
                f"{self.state.epoch + 1}, step {int(self.bad_step) + 1} of {steps}; training stopped there and nothing "
                "of this epoch was kept. Lower train.lr (or train.grad_clip), look for extreme or non-finite inputs, "
                "or train in fp32 (train.precision).")

    def _end_epoch(self, loss_sum: float, samples_per_s: float, seconds: float) -> None:
        """Validate, record the epoch, keep the best weights, and stop early after `patience` flat epochs. An epoch
        whose validation logits are not finite stops training (TrainingDiverged): it never becomes the best."""
        state, val = self.state, self.val_split
        logits = predict_logits(self.model, val.features)
        if not torch.isfinite(logits).all():
            rows = int((~torch.isfinite(logits)).any(1).sum())
            raise TrainingDiverged(f"training diverged on rank {self.rank}: after epoch {state.epoch + 1} the model's "
                                   f"logits are NaN or inf for {rows} of {len(logits)} validation rows; training "
                                   "stopped and this epoch was not kept. Lower train.lr, or look for extreme inputs.")
        scores = classification_metrics(val.labels.cpu().numpy(), logits.argmax(1).cpu().numpy(), self.n_classes)
        record = {"epoch": state.epoch + 1, "train_loss": loss_sum / (self.steps_per_epoch * self.world),
                  "val_loss": float(nn.functional.cross_entropy(logits, val.labels)),
                  "val_accuracy": scores["accuracy"], "val_f1_macro": scores["f1_macro"],
                  "samples_per_s": samples_per_s, "seconds": seconds, "lr": self.scheduler.get_last_lr()[0]}
        state.history.append(record)
        self.after_epoch(record)
        score = -record["val_loss"] if self.stop_on == STOP_ON_LOSS else record["val_f1_macro"]
        improved = score > state.best
        best_candidate = full_state(self.model)[0] if improved else None  # a collective under FSDP: every rank calls
        if improved:
            state.best, state.best_state, state.stale = score, best_candidate, 0
        else:
            state.stale += 1
        state.epoch, state.step_in_epoch, state.loss_sum = state.epoch + 1, 0, 0.0
        if state.stale >= self.settings.patience:
            state.epoch = self.settings.epochs  # early stop; recorded so a resume does not train on

    def checkpoint(self) -> None:
        """Every `checkpoint_every` steps and at each epoch end, on every rank: persist `checkpoint_state()`."""

    def before_step(self) -> None:
        """Before each step's forward pass (inside the out-of-memory retry)."""

    def after_step(self, step: int, steps: int) -> None:
        """After each optimizer step: `step` of `steps` in the current epoch."""

    def after_epoch(self, record: dict) -> None:
        """After each epoch's validation, with its history record."""

    def close(self) -> None:
        """After training: release what the hooks hold (a progress bar)."""


def train_model(model: nn.Module, train: Split, val: Split, params: TrainParams,
                n_classes: int | None = None, soft_targets: tuple[float, float] | None = None
                ) -> tuple[nn.Module, list[dict]]:
    """Single-process training without checkpoints (tests, benchmarks); returns the best model and the history.
    `params` apply as given (no `adapt`: the caller built the model); a null lr takes the model's own.
    `n_classes` defaults to the largest training label + 1 (stratified splits hold every class)."""
    params = fitted_settings(params, fit_training(params.model_copy(update={"adapt": False}), len(train.labels)))
    trainer = Trainer(params, n_classes or int(train.labels.max()) + 1, soft_targets=soft_targets)
    trainer.setup(model, train, val)
    state = trainer.train()
    model.load_state_dict(state.best_state)
    return model.eval(), state.history
