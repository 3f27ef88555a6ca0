"""Where training batches come from (tasks/training/batches.py): slices of a split on the device, or a DataLoader's
workers gathering from host memory, give the same batches and so train the same weights, a resume included; and
`train.loader_workers`' automatic rule picks as documented."""
from __future__ import annotations

import io
import multiprocessing
import pickle

import pytest
import torch

from models.cnn import ImageLayout, ImageResNet
from tasks.core.params_spec import TrainParams
from tasks.modalities.image.augment import augmenter
from tasks.modalities.image.settings import ImageAugment
from tasks.training.batches import MAX_AUTO_WORKERS, DeviceBatches, EpochWalk, LoaderBatches, StepBatches, plan_batches
from tasks.training.loop import Split, Trainer

LAYOUT = ImageLayout(height=8, width=8, channels=3, mean=[0.4] * 3, std=[0.2] * 3, n_classes=3)
AUGMENT = ImageAugment(flip=True, shift=1, brightness=0.3)   # every draw in play
SETTINGS = TrainParams(model="resnet", epochs=2, batch_size=16, lr=0.01, checkpoint_every=0, patience=5, seed=3)
MB = 2 ** 20


def images(count: int, seed: int) -> Split:
    generator = torch.Generator().manual_seed(seed)
    return Split(torch.randint(0, 256, (count, 8, 8, 3), dtype=torch.uint8, generator=generator),
                 torch.randint(0, 3, (count,), generator=generator))


def batches_of(source, epoch: int, first_step: int) -> list[tuple]:
    return [(step, inputs.clone(), tuple(t.clone() for t in targets))
            for step, inputs, targets in source.epoch(epoch, first_step)]


def test_the_loader_gives_the_batches_the_device_slices():
    """Rank 1 of 2, soft targets, augmentation on; a resumed epoch (first step 2) and a whole one."""
    split = images(70, seed=0)
    targets = (split.labels, torch.randn(70, 3, generator=torch.Generator().manual_seed(1)))
    walk = EpochWalk(seed=5, rank=1, shard=35, batch_size=8, steps=5)
    device = DeviceBatches(split.features, targets, walk, augmenter(AUGMENT, 5))
    loader = LoaderBatches(split.features, targets, walk, augmenter(AUGMENT, 5), 2, torch.device("cpu"))
    try:
        for epoch, first_step in ((0, 2), (1, 0)):
            expected, got = batches_of(device, epoch, first_step), batches_of(loader, epoch, first_step)
            assert [step for step, *_ in got] == list(range(first_step, walk.steps))
            for (_, inputs, labels), (_, want_inputs, want_labels) in zip(got, expected, strict=True):
                assert torch.equal(inputs, want_inputs)
                assert all(torch.equal(a, b) for a, b in zip(labels, want_labels, strict=True))
    finally:
        loader.close()
    assert not torch.equal(batches_of(device, 0, 0)[0][1], batches_of(device, 1, 0)[0][1])   # epochs reshuffle


def test_the_workers_dataset_pickles_for_spawned_workers():
    """Where workers start by spawn (macOS, Windows), the dataset, augmentation included, crosses by pickle."""
    split = images(20, seed=2)
    dataset = StepBatches(split.features, (split.labels,), EpochWalk(1, 0, 20, 8, 3), augmenter(AUGMENT, 1))
    copy = pickle.loads(pickle.dumps(dataset))
    assert all(torch.equal(a, b) for a, b in zip(copy[(1, 2)], dataset[(1, 2)], strict=True))


class Interrupted(Exception):
    pass


class StopsAtStep(Trainer):
    """Keeps the checkpoint taken at `stop_at` (through a weights-only round trip) and stops there."""

    def __init__(self, *args, stop_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_at, self.saved = stop_at, None

    def checkpoint(self) -> None:
        if self.state.global_step == self.stop_at:
            buffer = io.BytesIO()
            torch.save(self.checkpoint_state(), buffer)
            self.saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
            raise Interrupted


def trainer(workers: int, settings: TrainParams = SETTINGS, kind=Trainer, **kwargs) -> Trainer:
    """A tiny ResNet's Trainer on 96 random images (six steps an epoch), augmented, batches from `workers`."""
    torch.manual_seed(0)
    made = kind(settings, 3, **kwargs)
    made.augment, made.loader_workers = augmenter(AUGMENT, settings.seed), workers
    made.setup(ImageResNet(LAYOUT), images(96, seed=3), images(24, seed=4))
    return made


@pytest.fixture(scope="module")
def on_device():
    torch.set_num_threads(1)
    return trainer(0).train()


def same_weights(state, other) -> bool:
    return state.best_state.keys() == other.best_state.keys() and all(
        torch.equal(state.best_state[k], other.best_state[k]) for k in state.best_state)


def test_a_dataloader_trains_the_weights_the_device_split_trains(on_device):
    from_loader = trainer(1).train()
    assert [h["train_loss"] for h in from_loader.history] == [h["train_loss"] for h in on_device.history]
    assert same_weights(from_loader, on_device)


def test_a_run_stopped_mid_epoch_under_a_dataloader_resumes_on_the_device(on_device):
    """A checkpoint at step 3 of the second epoch (a checkpoint every step), taken with DataLoader workers, resumes
    with the split on the device to the uninterrupted run's weights: the source is not part of a run."""
    every_step = SETTINGS.model_copy(update={"checkpoint_every": 1})
    killed = trainer(1, every_step, StopsAtStep, stop_at=9)
    with pytest.raises(Interrupted):
        killed.train()
    killed.batches.close()
    assert killed.saved["loop"]["epoch"] == 1 and killed.saved["loop"]["step_in_epoch"] == 3
    resumed = trainer(0, every_step)
    resumed.load_checkpoint_state(killed.saved)
    assert same_weights(resumed.train(), on_device)


def test_closing_stops_the_workers():
    split = images(40, seed=5)
    before = len(multiprocessing.active_children())
    loader = LoaderBatches(split.features, (split.labels,), EpochWalk(0, 0, 40, 8, 5), None, 2, torch.device("cpu"))
    next(iter(loader.epoch(0, 0)))
    assert len(multiprocessing.active_children()) == before + 2
    loader.close()
    assert len(multiprocessing.active_children()) == before


@pytest.mark.parametrize("asked, is_image, split_mb, device, free_mb, cores, workers", [
    (None, False, 9_000, "cuda", 1_000, 16, 0),     # tables: always on the device
    (3, False, 10, "cpu", None, 16, 0),
    (None, True, 9_000, "cpu", None, 16, 0),        # a CPU: host memory is the device's
    (None, True, 250, "cuda", 1_000, 16, 0),        # a quarter of the free memory: stays on the GPU
    (None, True, 251, "cuda", 1_000, 16, MAX_AUTO_WORKERS),
    (None, True, 251, "cuda", 1_000, 4, 2),          # half the process's cores
    (None, True, 251, "cuda", 1_000, 1, 1),          # at least one
    (0, True, 9_000, "cuda", 1_000, 16, 0),          # asked: as asked
    (2, True, 10, "cuda", 80_000, 16, 2),
    (1, True, 10, "cpu", None, 16, 1),
])
def test_the_automatic_rule_picks_as_documented(asked, is_image, split_mb, device, free_mb, cores, workers):
    plan = plan_batches(asked, is_image, split_mb * MB, device, None if free_mb is None else free_mb * MB, cores)
    assert plan.workers == workers
    if not is_image:
        assert plan.note == ""
    elif workers:
        assert plan.note.startswith(f"images: DataLoader, {workers} worker")
        assert ("pinned memory" in plan.note) == (device == "cuda")
    else:
        assert plan.note.startswith(f"images: the training split on the device ({split_mb:,}.0 MB)")
