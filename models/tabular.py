"""Tabular classifiers whose preprocessing lives inside the module, so every export carries it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class FeatureLayout:
    """Column positions in the raw float matrix and the statistics fitted on the training split."""

    numeric_index: list[int]
    categorical_index: list[int]
    cardinalities: list[int]          # known categories per categorical column (code 0 = unknown)
    numeric_mean: list[float]
    numeric_std: list[float]
    n_classes: int

    def to_dict(self) -> dict:
        return asdict(self)


class TabularPreprocessor(nn.Module):
    """(B, F) raw floats -> (B, D) model inputs: impute + standardise numbers, embed category codes."""

    def __init__(self, layout: FeatureLayout, embedding_dim: int):
        super().__init__()
        self.register_buffer("numeric_index", torch.tensor(layout.numeric_index, dtype=torch.long))
        self.register_buffer("categorical_index", torch.tensor(layout.categorical_index, dtype=torch.long))
        self.register_buffer("mean", torch.tensor(layout.numeric_mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(layout.numeric_std, dtype=torch.float32))
        self.register_buffer("max_code", torch.tensor(layout.cardinalities, dtype=torch.long))
        self.embeddings = nn.ModuleList(nn.Embedding(k + 1, embedding_dim) for k in layout.cardinalities)
        self.has_numeric = bool(layout.numeric_index)
        self.out_features = len(layout.numeric_index) + embedding_dim * len(layout.cardinalities)

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """Standardised numbers (B, n_num) or None, and one (B, E) embedding per categorical column."""
        numbers = None
        if self.has_numeric:
            numbers = x.index_select(1, self.numeric_index)                    # (B, n_num)
            numbers = torch.where(torch.isnan(numbers), self.mean, numbers)    # missing -> training mean
            numbers = (numbers - self.mean) / self.std
        embedded = []
        if len(self.embeddings):
            codes = x.index_select(1, self.categorical_index)
            codes = torch.nan_to_num(codes, nan=0.0).long()
            # Out-of-range codes are unseen categories: map them to 0 ("unknown").
            codes = torch.where((codes < 0) | (codes > self.max_code), torch.zeros_like(codes), codes)
            embedded = [emb(codes[:, j]) for j, emb in enumerate(self.embeddings)]   # each (B, E)
        return numbers, embedded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        numbers, embedded = self.parts(x)
        return torch.cat(([numbers] if numbers is not None else []) + embedded, dim=1)


@dataclass(frozen=True)
class MLPConfig:
    """`train.model_args` of the `mlp` model."""

    hidden: list[int] = field(default_factory=lambda: [128, 64], metadata={"doc": "Hidden layer widths."})
    embedding_dim: int = field(default=8, metadata={"doc": "Embedding width per categorical column."})
    dropout: float = field(default=0.1, metadata={"doc": "Dropout after each hidden layer."})

    def __post_init__(self):
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden {self.hidden}: at least one layer, each at least 1 wide")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim {self.embedding_dim} must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")


def mlp_body(width: int, hidden: list[int], dropout: float, n_classes: int) -> nn.Sequential:
    """(B, width) -> [Linear, ReLU, Dropout] per hidden width -> (B, n_classes) logits."""
    layers: list[nn.Module] = []
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
        width = size
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


class TabularMLP(nn.Module):
    """Preprocessor -> [Linear, ReLU, Dropout]* -> logits (B, n_classes)."""

    Config = MLPConfig
    # The peak AdamW learning rate that trained it best in the measurements behind `auto`
    # (bench/results/auto_model.json); `train.lr` overrides it.
    default_lr = 3e-3
    modality = "table"
    auto = "default"   # what `auto` trains on a table below train.ft_min_rows training rows

    def __init__(self, layout: FeatureLayout, **hyper: Any):
        """`hyper`: MLPConfig's fields; its defaults fill the rest."""
        super().__init__()
        config = MLPConfig(**hyper)
        self.preprocess = TabularPreprocessor(layout, config.embedding_dim)
        self.body = mlp_body(self.preprocess.out_features, config.hidden, config.dropout, layout.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.preprocess(x))

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """The network alone, on already preprocessed (B, D) inputs (to time it without the preprocessing)."""
        return self.body(features)


MODELS = {"mlp": TabularMLP}   # the name(s) `train.model` selects (gathered by models/__init__.py)
