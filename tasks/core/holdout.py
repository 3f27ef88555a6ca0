"""The labelled holdout split every comparison uses (compress, profile, bless, canary)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core import paths
from tasks.core.encoding import encode_features, encode_target
from tasks.core.schema_spec import Schema
from tasks.modalities.image.shards import read_metadata, read_pixels


@dataclass(frozen=True)
class Holdout:
    rows: pd.DataFrame        # raw rows as prepared (features + target); images: their metadata rows
    features: np.ndarray      # (N, F) float32 encoded with the schema given; images: (N, H, W, C) uint8 pixels
    labels: np.ndarray        # (N,) class indices


def load_holdout(schema: Schema, path: Path = paths.HOLDOUT_SPLIT) -> Holdout:
    """The holdout by the schema: raw rows and their encoding, or for images the metadata rows and the pixels
    ((N, H, W, C) uint8: what an image model's graph takes raw)."""
    if schema.is_image:
        rows = read_metadata(path, schema.target)
        return Holdout(rows, read_pixels(path, schema.image.shape), encode_target(rows["label"], schema))
    rows = pd.read_parquet(path)
    return Holdout(rows, encode_features(rows, schema), encode_target(rows[schema.target], schema))
