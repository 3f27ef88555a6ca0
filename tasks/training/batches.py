"""Where each training step's batch comes from: slices of a split held on the training device, or a DataLoader whose
worker processes gather and augment each step's batch from a split in host memory (pinned on a GPU). Both give the
same batches, since a batch depends only on (seed, epoch, step): a resumed run sees the batches it would have seen,
whichever source it uses."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

# A step's batch: (its step in the epoch, inputs, targets: labels, and the teacher's logits when distilling).
Batch = tuple[int, torch.Tensor, tuple[torch.Tensor, ...]]
Augment = Callable[[torch.Tensor, int, int], torch.Tensor]   # (batch, epoch, step) -> the batch augmented

# The on-device path also holds each epoch's shuffled copy of the split: twice its size. A quarter of the free memory
# for the split leaves the other half to the model, its activations and the optimizer.
DEVICE_SHARE = 0.25
MAX_AUTO_WORKERS = 4
# Batches each worker prepares ahead: enough to hide a slow batch, few enough to keep host memory small.
PREFETCH_BATCHES = 2


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's shuffle depends only on (seed, epoch), so a resumed run sees the same batches."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


@dataclass(frozen=True)
class EpochWalk:
    """How one rank walks an epoch: its share of the shuffled rows, cut into steps of `batch_size` rows."""

    seed: int
    rank: int
    shard: int        # rows per rank per epoch
    batch_size: int   # rows per rank per step
    steps: int        # steps per epoch

    def rows(self, n: int, epoch: int) -> torch.Tensor:
        """This rank's row indices of the epoch, in the order its steps take them."""
        return epoch_order(n, self.seed, epoch)[self.rank * self.shard:(self.rank + 1) * self.shard]

    def step_slice(self, step: int) -> slice:
        return slice(step * self.batch_size, (step + 1) * self.batch_size)


@dataclass(frozen=True)
class BatchPlan:
    """Which source a run's batches come from, and the sentence metrics.json's `notes` keeps about it."""

    workers: int   # 0 = the split on the training device; N = a DataLoader with N worker processes
    note: str


def plan_batches(asked: int | None, loader_allowed: bool, split_bytes: int, device_type: str,
                 free_device_bytes: int | None, cores: int) -> BatchPlan:
    """`train.loader_workers` resolved: a modality without a batch loader (tables) always slices its split on the
    device; one with it (images) follows `asked`, or (None) stays on a CPU, and on a GPU stays on it while the split
    fits in DEVICE_SHARE of its free memory, else takes a DataLoader with half the process's cores as workers (1 to
    MAX_AUTO_WORKERS)."""
    if not loader_allowed:
        return BatchPlan(0, "")
    size = f"{split_bytes / 2 ** 20:,.1f} MB"
    if asked is not None:
        workers, why = asked, f"train.loader_workers: {asked}"
    elif device_type != "cuda" or free_device_bytes is None:
        workers, why = 0, "auto: on a CPU, host memory is the device's"
    elif split_bytes <= DEVICE_SHARE * free_device_bytes:
        workers, why = 0, f"auto: within a quarter of the GPU's {free_device_bytes / 2 ** 20:,.0f} MB free"
    else:
        workers = min(MAX_AUTO_WORKERS, max(1, cores // 2))
        why = f"auto: over a quarter of the GPU's {free_device_bytes / 2 ** 20:,.0f} MB free"
    if workers == 0:
        return BatchPlan(0, f"images: the training split on the device ({size}), a slice per step ({why})")
    pinned = ", pinned memory" if device_type == "cuda" else ""
    return BatchPlan(workers, f"images: DataLoader, {workers} worker{'s' if workers > 1 else ''}{pinned}, the "
                              f"training split in host memory ({size}) ({why})")


class DeviceBatches:
    """The epoch's batches as slices of a split held on the training device; nothing runs beside training."""

    def __init__(self, features: torch.Tensor, targets: tuple[torch.Tensor, ...], walk: EpochWalk,
                 augment: Augment | None):
        self.features, self.targets, self.walk, self.augment = features, targets, walk, augment

    def epoch(self, epoch: int, first_step: int) -> Iterator[Batch]:
        """The steps of `epoch` from `first_step` on: the rows gathered once in the epoch's order, then a contiguous
        slice per step (no per-batch gather on the hot path), augmented on the device."""
        walk = self.walk
        rows = walk.rows(len(self.features), epoch).to(self.features.device)
        features, targets = self.features[rows], tuple(t[rows] for t in self.targets)
        for step in range(first_step, walk.steps):
            batch = walk.step_slice(step)
            inputs = features[batch] if self.augment is None else self.augment(features[batch], epoch, step)
            yield step, inputs, tuple(t[batch] for t in targets)

    def close(self) -> None:
        """Nothing runs beside the training process."""


class StepBatches(Dataset):
    """(epoch, step) -> that step's (inputs, *targets): the same rows `DeviceBatches` slices, gathered from a split
    in host memory and augmented, in a DataLoader worker."""

    def __init__(self, features: torch.Tensor, targets: tuple[torch.Tensor, ...], walk: EpochWalk,
                 augment: Augment | None):
        self.features, self.targets, self.walk, self.augment = features, targets, walk, augment
        self.epoch, self.rows = -1, torch.empty(0, dtype=torch.long)   # each worker shuffles once per epoch

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        epoch, step = key
        if epoch != self.epoch:
            self.epoch, self.rows = epoch, self.walk.rows(len(self.features), epoch)
        rows = self.rows[self.walk.step_slice(step)]
        inputs = self.features[rows]
        if self.augment is not None:
            inputs = self.augment(inputs, epoch, step)
        return (inputs, *(t[rows] for t in self.targets))


class EpochSteps(Sampler):
    """The (epoch, step) keys of one epoch from its first step on. The trainer sets `epoch` and `first_step` before
    each epoch; the sampler runs in the training process, so persistent workers need not hear of it."""

    def __init__(self, steps: int):
        self.steps, self.epoch, self.first_step = steps, 0, 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, step) for step in range(self.first_step, self.steps))

    def __len__(self) -> int:
        return self.steps - self.first_step


class LoaderBatches:
    """The epoch's batches from a DataLoader: `workers` processes gather and augment each step's batch from the host
    split, pinned and copied without blocking on a GPU. The workers live across epochs; `close` stops them."""

    def __init__(self, features: torch.Tensor, targets: tuple[torch.Tensor, ...], walk: EpochWalk,
                 augment: Augment | None, workers: int, device: torch.device):
        self.dataset, self.sampler = StepBatches(features, targets, walk, augment), EpochSteps(walk.steps)
        self.workers, self.device, self.loader = workers, device, None
        self.pinned = device.type == "cuda"

    def epoch(self, epoch: int, first_step: int) -> Iterator[Batch]:
        """The steps of `epoch` from `first_step` on, moved to the training device."""
        if self.loader is None:   # started at the first epoch (after a resume), not at setup
            self.loader = DataLoader(self.dataset, batch_size=None, sampler=self.sampler, num_workers=self.workers,
                                     pin_memory=self.pinned, persistent_workers=True,
                                     prefetch_factor=PREFETCH_BATCHES)
        self.sampler.epoch, self.sampler.first_step = epoch, first_step
        for step, (inputs, *targets) in enumerate(self.loader, start=first_step):
            yield (step, inputs.to(self.device, non_blocking=self.pinned),
                   tuple(t.to(self.device, non_blocking=self.pinned) for t in targets))

    def close(self) -> None:
        """Stop the workers: the DataLoader's iterator shuts them down when it goes."""
        self.loader = None


def batch_source(features: torch.Tensor, targets: tuple[torch.Tensor, ...], walk: EpochWalk,
                 augment: Augment | None, workers: int, device: torch.device) -> DeviceBatches | LoaderBatches:
    """Slices of the split on the device (`workers` 0), else a DataLoader with `workers` processes."""
    if workers == 0:
        return DeviceBatches(features.to(device), tuple(t.to(device) for t in targets), walk, augment)
    # the workers gather on the host: a DataLoader worker never touches CUDA
    return LoaderBatches(features.cpu(), tuple(t.cpu() for t in targets), walk, augment, workers, device)
