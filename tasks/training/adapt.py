"""Training that fits the table it gets: the model `auto` picks, and a schedule sized in optimizer steps.

Counting epochs alone starves small tables: 1,257 training rows at batch 512 make 3 steps an epoch, 24 in
8 epochs, and digits then scores macro-F1 0.56 where a logistic regression reaches 0.98. Here the batch
shrinks until an epoch has at least MIN_BATCHES_PER_EPOCH steps, epochs rise until the run has
`train.min_steps`, and patience stretches with them; tables as large as the default data keep the values
in params.yaml unchanged.

On a GPU a step of this engine's models is bound by kernel launches, not arithmetic: 1M rows trained at 71,500
samples/s at batch 512 on an H200, the rate of 70k rows. So on CUDA the batch grows, a power of two up
to GPU_MAX_BATCH, while an epoch keeps at least GPU_MIN_STEPS_PER_EPOCH steps, and the learning rate grows with
the square root of the batch (as for Adam-type optimizers); the default data (70k training rows) keeps batch 512.
Pure: the rows and the device kind in, the effective settings and the reasons out.
"""
from __future__ import annotations

import math

from pydantic import BaseModel

from models import auto_models, default_lr
from tasks.core.params_spec import AUTO, TrainParams
from tasks.modalities import fallback_modality
from tasks.modalities.interface import Modality

MIN_BATCHES_PER_EPOCH = 16
MIN_BATCH = 32
GPU_MIN_STEPS_PER_EPOCH = 128
GPU_MAX_BATCH = 8192


class FittedTraining(BaseModel):
    """What a run trains with, and why it differs from params.yaml."""

    model: str
    batch_size: int
    epochs: int
    patience: int
    lr: float
    train_rows: int
    steps_per_epoch: int
    reasons: list[str]
    folds: int = 1                     # > 1: cross-validated members, served as one averaging graph
    candidates: dict[str, float] = {}  # family -> its lr: what cross-validation compares (one entry = no choice)

    def headline(self) -> str:
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        members = f" × {self.folds} fold members" if self.folds > 1 else ""
        return (f"{self.model}{members}, batch {self.batch_size}, up to {self.epochs} epochs × "
                f"{self.steps_per_epoch} steps, lr {self.lr:g}{why}")


def cross_validation_plan(settings: TrainParams, train_rows: int, modality: Modality | None = None
                          ) -> tuple[int, list[str]]:
    """(folds, families to compare): folds > 1 below `cv_max_rows` for a modality that cross-validates (tables:
    images are not, as the members' cost would be the network's times k); `auto` then compares the modality's
    `compared` families (models/: the linear model and the MLP on periodic numeric embeddings for tables, simplest
    first by name, which wins a tie)."""
    modality = modality or fallback_modality()
    if not modality.cross_validates or not 0 < train_rows < settings.cv_max_rows:
        return 1, []
    return settings.cv_folds, auto_models(modality.name, "compared") if settings.model == AUTO else [settings.model]


def pick_model(settings: TrainParams, train_rows: int, modality: Modality | None = None,
               large_from: tuple[int, str] | None = None) -> tuple[str, str | None]:
    """`auto` -> the modality's `default` family below `large_from` training rows (its `large_from(params)`;
    `train.ft_min_rows` unless given), else its `large` one where it has one (tables: the MLP, then the
    FT-Transformer); an explicit model stays. Below `cv_max_rows` the default is provisional: cross-validation picks
    among the `compared` families (tasks/training/crossval.py)."""
    if settings.model != AUTO:
        return settings.model, None
    modality = modality or fallback_modality()
    default, large = auto_models(modality.name, "default")[0], auto_models(modality.name, "large")
    folds, families = cross_validation_plan(settings, train_rows, modality)
    if len(families) > 1:
        return default, (f"auto compares {', '.join(families)} by {folds}-fold out-of-fold score: {train_rows:,} "
                         f"training rows < train.cv_max_rows {settings.cv_max_rows:,}")
    if not large:
        return default, f"auto picked {default} for the {modality.name} modality"
    threshold, setting = large_from or (settings.ft_min_rows, "train.ft_min_rows")
    if train_rows < threshold:
        return default, f"auto picked {default}: {train_rows:,} training rows < {setting} {threshold:,}"
    return large[0], f"auto picked {large[0]}: {train_rows:,} training rows >= {setting} {threshold:,}"


def gpu_batch(batch: int, train_rows: int) -> int:
    """The batch on a GPU: the largest power of two <= GPU_MAX_BATCH that leaves an epoch >= GPU_MIN_STEPS_PER_EPOCH
    steps, where that is larger than `batch`; else `batch`."""
    fitting = 1 << max(0, (train_rows // GPU_MIN_STEPS_PER_EPOCH).bit_length() - 1)
    return max(batch, min(GPU_MAX_BATCH, fitting))


def fit_training(settings: TrainParams, train_rows: int, device: str = "cpu", modality: Modality | None = None,
                 large_from: tuple[int, str] | None = None) -> FittedTraining:
    """The effective model, batch, epochs, patience and learning rate for `train_rows` training rows on a `device`
    of that kind ("cpu" or "cuda"), for a model of `modality` (None: the fallback's, tables)."""
    model, picked = pick_model(settings, train_rows, modality, large_from)
    reasons = [picked] if picked else []
    folds, families = cross_validation_plan(settings, train_rows, modality)
    if folds > 1 and len(families) < 2:   # with two families, `picked` already says why there are folds
        reasons.append(f"{folds} cross-validated members: {train_rows:,} training rows < train.cv_max_rows "
                       f"{settings.cv_max_rows:,}")
    table_rows = train_rows
    if folds > 1:
        train_rows -= train_rows // folds   # a member trains on k-1 folds: fit its schedule to those rows
    batch, epochs, patience, lr_scale = settings.batch_size, settings.epochs, settings.patience, 1.0
    if settings.adapt:
        fitting = max(MIN_BATCH, 1 << max(0, (train_rows // MIN_BATCHES_PER_EPOCH).bit_length() - 1))
        if fitting < batch:
            reasons.append(f"batch {batch} -> {fitting} so an epoch has >= {MIN_BATCHES_PER_EPOCH} steps")
            batch = fitting
        grown = gpu_batch(batch, train_rows) if device == "cuda" else batch
        if grown > batch:
            reasons.append(f"batch {batch} -> {grown} on a GPU: an epoch keeps >= {GPU_MIN_STEPS_PER_EPOCH} steps, and "
                           "a small batch leaves the GPU waiting on kernel launches")
            lr_scale, batch = math.sqrt(grown / batch), grown
        steps = max(1, math.ceil(train_rows / batch))
        needed = min(settings.max_epochs, math.ceil(settings.min_steps / steps))
        if needed > epochs:
            reasons.append(f"epochs {epochs} -> {needed} to reach train.min_steps {settings.min_steps} "
                           f"at {steps} steps an epoch")
            patience = max(patience, math.ceil(patience * needed / epochs))
            reasons.append(f"patience {settings.patience} -> {patience} epochs")
            epochs = needed
    lr = settings.lr if settings.lr is not None else default_lr(model)   # each model file declares its own
    if lr_scale != 1.0:
        reasons.append(f"lr {lr:g} -> {lr * lr_scale:g} with the batch (square-root scaling)")
        lr *= lr_scale
    candidates = {name: settings.lr if settings.lr is not None else default_lr(name) for name in families}
    return FittedTraining(model=model, batch_size=batch, epochs=epochs, patience=patience, lr=lr,
                          train_rows=table_rows, steps_per_epoch=max(1, math.ceil(train_rows / batch)),
                          reasons=reasons, folds=folds, candidates=candidates)


def fitted_settings(settings: TrainParams, fitted: FittedTraining) -> TrainParams:
    """The settings the engine runs with: `settings` with the fitted values in, nothing left to resolve."""
    return settings.model_copy(update={"model": fitted.model, "batch_size": fitted.batch_size,
                                       "epochs": fitted.epochs, "patience": fitted.patience, "lr": fitted.lr,
                                       "adapt": False})
