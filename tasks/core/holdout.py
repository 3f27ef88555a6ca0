"""The labelled holdout split every comparison uses (compress, profile, bless, canary)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core import paths
from tasks.core.encoding import encode_features, encode_target
from tasks.core.schema_spec import Schema


@dataclass(frozen=True)
class Holdout:
    rows: pd.DataFrame        # raw rows as prepared (features + target)
    features: np.ndarray      # (N, F) float32 encoded with the schema given
    labels: np.ndarray        # (N,) class indices


def load_holdout(schema: Schema, path: Path = paths.HOLDOUT_SPLIT) -> Holdout:
    rows = pd.read_parquet(path)
    return Holdout(rows, encode_features(rows, schema), encode_target(rows[schema.target], schema))
