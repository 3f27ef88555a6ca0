"""Label-safe augmentation of training batches (tasks/modalities/image/augment.py augmenter): the same (seed, epoch,
step) gives the same batch (a resumed run sees what it would have seen), dtype and shape are kept, a digit is never
mirrored under the default params, a shift moves an image by at most `shift` pixels, brightness saturates at 255
instead of wrapping round, and with everything off there is nothing to run."""
from __future__ import annotations

import pytest
import torch

from tasks.modalities.image.augment import augmenter
from tasks.modalities.image.settings import ImageAugment

OFF = ImageAugment(flip=False, shift=0, brightness=0.0)


def noise(count: int = 16, height: int = 12, width: int = 10, channels: int = 3, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, height, width, channels), dtype=torch.uint8, generator=generator)


def half_lit(count: int = 64, side: int = 8) -> torch.Tensor:
    """(count, side, side, 1): the left half dark, the right half lit (a mirror swaps them)."""
    batch = torch.zeros(count, side, side, 1, dtype=torch.uint8)
    batch[:, :, side // 2:] = 200
    return batch


def test_everything_off_is_no_augmenter():
    assert augmenter(OFF, seed=0) is None
    assert augmenter(ImageAugment(), seed=0) is not None


def test_the_same_seed_epoch_and_step_give_the_same_batch():
    augment, batch = augmenter(ImageAugment(flip=True, shift=2, brightness=0.3), seed=7), noise()
    first = augment(batch, 3, 5)
    assert torch.equal(first, augment(batch.clone(), 3, 5))
    assert torch.equal(first, augmenter(ImageAugment(flip=True, shift=2, brightness=0.3), seed=7)(batch, 3, 5))
    others = [augment(batch, 3, 6), augment(batch, 4, 5), augmenter(ImageAugment(flip=True, shift=2,
                                                                               brightness=0.3), seed=8)(batch, 3, 5)]
    assert all(not torch.equal(first, other) for other in others)


@pytest.mark.parametrize("shape", [(5, 8, 8, 1), (4, 12, 10, 3), (1, 3, 17, 3)])
@pytest.mark.parametrize("rules", [ImageAugment(), ImageAugment(flip=True, shift=3, brightness=0.5),
                                   ImageAugment(shift=0, brightness=0.2), ImageAugment(shift=2, brightness=0.0)])
def test_dtype_and_shape_are_kept(shape, rules):
    batch = noise(*shape)
    out = augmenter(rules, seed=1)(batch, 0, 0)
    assert out.dtype == torch.uint8 and out.shape == batch.shape


def test_a_digit_is_never_mirrored_under_the_default_params():
    defaults, mirroring = augmenter(ImageAugment(), seed=0), augmenter(ImageAugment(flip=True), seed=0)
    batch = half_lit()
    steps = [(epoch, step) for epoch in range(3) for step in range(10)]
    for epoch, step in steps:   # a shift of 1 and brightness 0.9..1.1 keep the left edge dark and the right lit
        out = defaults(batch, epoch, step)
        assert (out[:, :, 0] == 0).all() and (out[:, :, -1] >= 180).all(), (epoch, step)
    mirrored = sum(int((mirroring(batch, epoch, step)[:, :, 0] > 0).any((1, 2)).sum()) for epoch, step in steps)
    assert 0.3 < mirrored / (len(steps) * len(batch)) < 0.7   # flip on: about half the images are mirrored


@pytest.mark.parametrize("shift", [1, 3])
def test_a_shift_moves_an_image_by_at_most_shift_pixels_each_way(shift):
    batch = torch.zeros(64, 15, 15, 1, dtype=torch.uint8)
    batch[:, 7, 7] = 255   # one lit pixel in the middle, far from the edges
    augment = augmenter(ImageAugment(shift=shift, brightness=0.0), seed=2)
    moves = set()
    for step in range(8):
        out = augment(batch, 0, step)
        assert (out.flatten(1) == 255).sum(1).eq(1).all() and (out.flatten(1) == 0).sum(1).eq(15 * 15 - 1).all()
        rows, cols = torch.nonzero(out[..., 0] == 255)[:, 1:].T
        moves |= {(int(r) - 7, int(c) - 7) for r, c in zip(rows, cols)}
    assert max(max(abs(dy), abs(dx)) for dy, dx in moves) == shift   # reaches the bound, never passes it
    assert (0, 0) in moves and len(moves) == (2 * shift + 1) ** 2   # every offset in the square is drawn


def test_brightness_saturates_at_255_and_never_wraps():
    batch = torch.full((256, 4, 4, 3), 250, dtype=torch.uint8)
    batch[:, 0, 0] = 2
    out = augmenter(ImageAugment(shift=0, brightness=0.5), seed=3)(batch, 0, 0)
    lit = out[:, 1:, 1:].to(torch.int32)
    assert lit.min() >= 125 and lit.max() == 255   # scaled by 0.5..1.5: the brighter images reach 255, no further
    assert (lit == 255).any((1, 2, 3)).float().mean() > 0.3 and (lit < 250).any()
    assert out[:, 0, 0].max() <= 3   # a dark pixel stays dark
    # each image is scaled as one: its pixels keep their order
    assert (out[:, 0, 0, 0].to(torch.int32) <= lit[:, 0, 0, 0]).all()
