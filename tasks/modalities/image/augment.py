"""Label-safe augmentation of training images, each batch deterministic in seed, epoch and step, so a resumed run
sees the batches it would have seen, from either batch source of the training engine (tasks/training/batches.py)."""
from __future__ import annotations

import functools

import torch
from torch import nn

from tasks.modalities.image.settings import ImageAugment


def augmenter(rules: ImageAugment, seed: int):
    """(B, H, W, C) uint8 batch, epoch, step -> the batch augmented (`augment_batch`), or None when every
    augmentation is off. A partial of a module-level function: DataLoader workers started by spawn can unpickle it."""
    if not (rules.shift or rules.flip or rules.brightness):
        return None
    return functools.partial(augment_batch, rules, seed)


def augment_batch(rules: ImageAugment, seed: int, batch: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
    """The batch shifted by up to `shift` pixels each way (edges repeated), mirrored left-right where `flip` allows
    it, and its values scaled by 1 +- `brightness`. The draws come from a CPU generator seeded by (seed, epoch, step),
    so the batch is the same on any device and in any process."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 10_007 + step)
    count, height, width, _ = batch.shape
    out = batch
    if rules.shift:
        pad = rules.shift
        padded = nn.functional.pad(batch.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
        dy = torch.randint(0, 2 * pad + 1, (count,), generator=generator).to(batch.device)
        dx = torch.randint(0, 2 * pad + 1, (count,), generator=generator).to(batch.device)
        rows = (dy[:, None] + torch.arange(height, device=batch.device))[:, None, :, None]   # (B, 1, H, 1)
        cols = (dx[:, None] + torch.arange(width, device=batch.device))[:, None, None, :]    # (B, 1, 1, W)
        picked = padded[torch.arange(count, device=batch.device)[:, None, None, None],
                        torch.arange(padded.shape[1], device=batch.device)[None, :, None, None], rows, cols]
        out = picked.permute(0, 2, 3, 1).round().to(torch.uint8)
    if rules.flip:
        mirrored = torch.rand(count, generator=generator).to(batch.device) < 0.5
        out = torch.where(mirrored[:, None, None, None], out.flip(2), out)
    if rules.brightness:
        scale = 1 + (torch.rand(count, generator=generator).to(batch.device) * 2 - 1) * rules.brightness
        out = (out.float() * scale[:, None, None, None]).round().clamp(0, 255).to(torch.uint8)
    return out
