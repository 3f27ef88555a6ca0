"""Image classifiers whose preprocessing lives inside the module: raw uint8 pixels in, logits out, so every export
(ONNX, .pt2) takes the pixels a client sends (after the one resize rule) and normalises them itself.

`ImageResNet` is a small ResNet (He et al. 2016, the CIFAR variant: 3x3 convolutions, one stride-2 stage after
another, global average pooling); its widths follow the image size unless given."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ImageLayout:
    """The pixels a model takes and the statistics fitted on the training split."""

    height: int
    width: int
    channels: int
    mean: list[float]      # per channel, on the 0..1 scale
    std: list[float]
    n_classes: int

    def to_dict(self) -> dict:
        return asdict(self)


class ImagePreprocessor(nn.Module):
    """(B, H, W, C) uint8 pixels -> (B, C, H, W) float32, scaled to 0..1 and standardised per channel with the
    training split's mean and std. Any user module can start with it."""

    def __init__(self, layout: ImageLayout):
        super().__init__()
        self.register_buffer("mean", torch.tensor(layout.mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("scale", (1.0 / (255.0 * torch.tensor(layout.std, dtype=torch.float32))).view(1, -1, 1, 1))
        self.register_buffer("offset", (torch.tensor(layout.mean, dtype=torch.float32)
                                        / torch.tensor(layout.std, dtype=torch.float32)).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pixels = x.permute(0, 3, 1, 2).float()          # (B, C, H, W), 0..255
        return pixels * self.scale - self.offset        # (p / 255 - mean) / std in one multiply-add


def widths_for(layout: ImageLayout) -> list[int]:
    """The rule `widths: null` follows: a stage per halving down to about 4x4 pixels (at least two, at most four),
    16 channels first and doubling."""
    side = min(layout.height, layout.width)
    stages = max(2, min(4, (side // 4).bit_length()))
    return [16 * 2 ** i for i in range(stages)]


@dataclass(frozen=True)
class ResNetConfig:
    """`train.model_args` of the `resnet` model."""

    widths: list[int] | None = field(default=None, metadata={
        "doc": "Channels per stage (each stage after the first halves the resolution); null = by the image size: "
               "a stage per halving down to about 4x4 pixels, 16 channels first, doubling."})
    blocks: int = field(default=1, metadata={"doc": "Residual blocks per stage."})
    dropout: float = field(default=0.0, metadata={"doc": "Dropout before the classifier."})

    def __post_init__(self):
        if self.widths is not None and (not self.widths or min(self.widths) < 1):
            raise ValueError(f"widths {self.widths}: at least one stage, each at least 1 channel")
        if self.blocks < 1:
            raise ValueError(f"blocks {self.blocks} must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (a strided 1x1 convolution where the shape changes), ReLU."""

    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Identity() if stride == 1 and inputs == outputs else nn.Sequential(
            nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ImageResNet(nn.Module):
    """Preprocessor -> stem conv -> residual stages -> global average pool (the embedding, (B, widths[-1])) ->
    dropout -> Linear -> logits (B, n_classes)."""

    Config = ResNetConfig
    default_lr = 3e-3
    modality = "image"   # what it takes (tasks/modalities/: a model without it takes the fallback's, tables)
    auto = "default"     # what `auto` trains on images
    head = "fc"   # the classifier: what trains when a pretrained backbone is frozen

    def __init__(self, layout: ImageLayout, **hyper: Any):
        super().__init__()
        config = ResNetConfig(**hyper)
        widths = config.widths or widths_for(layout)
        self.preprocess = ImagePreprocessor(layout)
        self.stem = nn.Sequential(nn.Conv2d(layout.channels, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, inputs = [], widths[0]
        for index, width in enumerate(widths):
            for block in range(config.blocks):
                stages.append(BasicBlock(inputs, width, 2 if index > 0 and block == 0 else 1))
                inputs = width
        self.stages = nn.Sequential(*stages)
        self.dropout = nn.Dropout(config.dropout)
        self.fc = nn.Linear(widths[-1], layout.n_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) uint8 -> (B, D) the pooled features the classifier reads (the monitor watches them)."""
        features = self.stages(self.stem(self.preprocess(x)))   # (B, D, h, w)
        return features.mean(dim=(2, 3))

    def logits_and_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both in one pass: the served graph outputs the embedding beside the logits
        (tasks/modalities/image/graph.py)."""
        embedding = self.embed(x)
        return self.fc(self.dropout(embedding)), embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits_and_embedding(x)[0]


MODELS = {"resnet": ImageResNet}   # the name(s) `train.model` selects (gathered by models/__init__.py)
