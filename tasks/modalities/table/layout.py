"""A table model's layout: which encoded columns are numbers and which categories, and the numbers' mean and std,
fitted on the training split only (models/tabular.py FeatureLayout)."""
from __future__ import annotations

import numpy as np
import torch

from models.tabular import FeatureLayout
from tasks.core.schema_spec import Schema
from tasks.modalities.interface import Probe


def fit_layout(features: np.ndarray, schema: Schema) -> FeatureLayout:
    """Numeric mean/std and category counts from the training split only."""
    numeric = [j for j, f in enumerate(schema.features) if f.kind == "numeric"]
    categorical = [j for j, f in enumerate(schema.features) if f.kind == "categorical"]
    values = features[:, numeric].astype(np.float64)
    mean = np.nan_to_num(np.nanmean(values, axis=0)) if numeric else np.zeros(0)
    std = np.nan_to_num(np.nanstd(values, axis=0), nan=1.0) if numeric else np.zeros(0)
    std = np.where(std < 1e-8, 1.0, std)
    return FeatureLayout(numeric_index=numeric, categorical_index=categorical,
                         cardinalities=[len(schema.features[j].categories) for j in categorical],
                         numeric_mean=[float(v) for v in mean], numeric_std=[float(v) for v in std],
                         n_classes=len(schema.classes))


def model_probe(n_classes: int = 3) -> Probe:
    """A layout of every kind a table has (numbers, categories) and rows holding missing values and unseen codes."""
    layout = FeatureLayout(numeric_index=[0, 1, 2], categorical_index=[3, 4], cardinalities=[3, 5],
                           numeric_mean=[0.0, 10.0, -3.0], numeric_std=[1.0, 5.0, 2.0], n_classes=n_classes)
    rows = torch.tensor([[0.5, 12.0, -1.0, 1.0, 2.0], [float("nan"), 3.0, float("nan"), 0.0, 5.0],
                         [1e4, -1e4, 0.0, 3.0, 0.0], [float("nan")] * 3 + [0.0, 0.0],
                         [-2.0, 9.0, -3.0, 2.0, 4.0], [0.0, 0.0, 0.0, 9.0, -3.0]], dtype=torch.float32)
    return Probe(layout, rows, "(B, 5) float32 rows with NaN for missing numbers and codes for categories")
