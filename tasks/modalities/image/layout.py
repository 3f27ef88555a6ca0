"""An image model's layout: the pixels it takes and their per-channel statistics, fitted on the training split only
(models/cnn.py ImageLayout)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models.cnn import ImageLayout
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import image_shape
from tasks.modalities.interface import PROBE_BATCH, Probe


def fit_image_layout(pixels: np.ndarray, schema: Schema) -> ImageLayout:
    """Per-channel mean and std (0..1 scale) of the training images, in chunks (a large set is not copied to
    float whole)."""
    channels = pixels.shape[3]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for start in range(0, len(pixels), 4096):
        chunk = pixels[start:start + 4096].reshape(-1, channels).astype(np.float64) / 255.0
        total += chunk.sum(axis=0)
        squares += (chunk ** 2).sum(axis=0)
        count += len(chunk)
    mean = total / max(1, count)
    std = np.sqrt(np.maximum(squares / max(1, count) - mean ** 2, 0.0))
    std = np.where(std < 1e-4, 1.0, std)
    image = image_shape(schema)
    return ImageLayout(height=image.height, width=image.width, channels=image.channels,
                       mean=[float(v) for v in mean], std=[float(v) for v in std], n_classes=len(schema.classes))


def model_probe(height: int, width: int, channels: int, n_classes: int = 3) -> Probe:
    """A layout of the set's size and channels, and pixels from black to white to noise."""
    layout = ImageLayout(height=height, width=width, channels=channels, mean=[0.45] * channels,
                         std=[0.25] * channels, n_classes=n_classes)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (PROBE_BATCH, height, width, channels), dtype=torch.uint8, generator=generator)
    pixels[0], pixels[1] = 0, 255
    return Probe(layout, pixels, f"(B, {height}, {width}, {channels}) uint8 pixels")


def first_image_shape(params) -> tuple[int, int, int]:
    """(height, width, channels) a source's images will have: images.size (or the first image's own size) and the
    first image's channels, read from its header."""
    from tasks.modalities.image.decode import CHANNELS, MODE_OF
    from tasks.modalities.image.sources import (
        SHAPE_SIDE,
        first_image_header,
        folder_images,
        is_packaged,
        manifest_images,
    )

    source = params.data.source
    if is_packaged(source):
        height, width, channels = (8, 8, 1) if source.endswith("digits") else (SHAPE_SIDE, SHAPE_SIDE, 3)
    else:
        path = Path(source)
        files = folder_images(path) if path.is_dir() else manifest_images(path, params.data.target,
                                                                          params.images.path_column)
        width, height, mode = first_image_header(files, int(params.images.max_file_mb * (1 << 20)))
        channels = CHANNELS[MODE_OF.get(mode, "RGB")]
    if params.images.size:
        height, width = params.images.size
    return height, width, channels


def source_classes(params, target: str) -> int:
    """How many class folders (or manifest labels) the source's images hold (3 where it cannot be read: prepare then
    names the problem)."""
    from tasks.modalities.image.sources import list_images

    try:
        files, _ = list_images(params.data.source, target, params.images.path_column, 8 * 4,
                               params.data.seed)   # shapes: 8 of each class
        return len({f.label for f in files if f.label is not None})
    except Exception:   # an unreadable source is prepare's to describe
        return 3
