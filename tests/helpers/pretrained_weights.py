"""Pretrained weights the tests make themselves: a small ResNet trained for a second on scikit-learn's packaged digits,
saved as a safetensors file with its sha256 (nothing comes from a hub)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models import build_model
from models.cnn import ImageLayout
from tasks.core.params_spec import PretrainedParams, TrainParams
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.layout import fit_image_layout
from tasks.modalities.image.sources import packaged_digits
from tasks.training.loop import Split, train_model

DIGITS = Schema(source="images:digits", target="label", classes=[str(d) for d in range(10)], modality="image",
                inputs=ImageShape(height=8, width=8, channels=1, mode="L").model_dump())
WIDTHS = [8, 16]   # a small ResNet: two stages, a second of training on 1,200 digits
RESNET = {"resnet": {"widths": WIDTHS}}


@dataclass(frozen=True)
class Digits:
    """scikit-learn's digits, split: train / val / holdout pixels (N, 8, 8, 1) uint8 and class indices."""

    pixels: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    layout: ImageLayout

    def split(self, name: str) -> Split:
        """One split as the training engine takes it."""
        return Split(torch.from_numpy(self.pixels[name]), torch.from_numpy(self.labels[name]))


def digits() -> Digits:
    """The packaged digits in three fixed slices, and the layout fitted on the training one."""
    pixels, labels = packaged_digits()
    y = np.array([int(v) for v in labels], dtype=np.int64)
    cuts = {"train": slice(0, 1200), "val": slice(1200, 1500), "holdout": slice(1500, None)}
    return Digits({name: pixels[cut] for name, cut in cuts.items()}, {name: y[cut] for name, cut in cuts.items()},
                  fit_image_layout(pixels[cuts["train"]], DIGITS))


def resnet(layout: ImageLayout, seed: int) -> nn.Module:
    """A freshly built small ResNet, initialised from `seed`."""
    torch.manual_seed(seed)
    return build_model("resnet", layout, widths=WIDTHS)


def trained_resnet(data: Digits, epochs: int = 3) -> nn.Module:
    """The small ResNet after a few epochs on the digits: weights and batch-norm statistics far from a fresh one's."""
    settings = TrainParams(model="resnet", model_args=RESNET, epochs=epochs, batch_size=64, lr=0.01, patience=epochs,
                           seed=0)
    model, _ = train_model(resnet(data.layout, seed=0), data.split("train"), data.split("val"), settings, 10)
    return model.eval()


def sha256_of(path: Path) -> str:
    """What train.pretrained.sha256 pins (`sha256sum FILE`)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_weights(model: nn.Module, path: Path) -> PretrainedParams:
    """Write `model`'s state dict as safetensors; returns train.pretrained pinned to it."""
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(path))
    return PretrainedParams(path=str(path), sha256=sha256_of(path))
