"""The MLP on periodic numeric embeddings (PLR: periodic -> linear -> ReLU; Gorishniy, Rubachev, Babenko, "On
Embeddings for Numerical Features in Tabular Deep Learning", NeurIPS 2022). Each standardised number x becomes
ReLU(W_j [cos(2 pi c_j x), sin(2 pi c_j x)] + b_j) with learned frequencies c_j: a few dozen bumps per column, so
the network can draw the thresholds a tree draws (modechoice: a plain MLP and a linear model trail boosting by 7-11
macro-F1 points; this one does not, bench/results/tables.json). Categorical columns keep the plain MLP's embeddings."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from models.tabular import FeatureLayout, TabularPreprocessor, mlp_body


@dataclass(frozen=True)
class PeriodicMLPConfig:
    """`train.model_args` of the `mlp_plr` model."""

    hidden: list[int] = field(default_factory=lambda: [128, 64], metadata={"doc": "Hidden layer widths."})
    frequencies: int = field(default=16, metadata={"doc": "Learned frequencies per numeric column."})
    numeric_dim: int = field(default=8, metadata={"doc": "Embedding width per numeric column."})
    sigma: float = field(default=0.3, metadata={"doc": "Standard deviation the frequencies start from (on "
                                                       "standardised numbers)."})
    embedding_dim: int = field(default=8, metadata={"doc": "Embedding width per categorical column."})
    dropout: float = field(default=0.1, metadata={"doc": "Dropout after each hidden layer."})

    def __post_init__(self):
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden {self.hidden}: at least one layer, each at least 1 wide")
        if min(self.frequencies, self.numeric_dim, self.embedding_dim) < 1:
            raise ValueError("frequencies, numeric_dim and embedding_dim must each be at least 1")
        if self.sigma <= 0:
            raise ValueError(f"sigma {self.sigma} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")


class PeriodicEmbeddings(nn.Module):
    """(B, n) standardised numbers -> (B, n * d): per column, ReLU(linear(cos, sin of 2 pi c x))."""

    def __init__(self, columns: int, frequencies: int, dim: int, sigma: float):
        super().__init__()
        self.frequencies = nn.Parameter(torch.randn(columns, frequencies) * sigma)               # (n, k)
        self.weight = nn.Parameter(torch.randn(columns, 2 * frequencies, dim) / math.sqrt(2 * frequencies))
        self.bias = nn.Parameter(torch.zeros(columns, dim))                                        # (n, d)

    def forward(self, numbers: torch.Tensor) -> torch.Tensor:
        angles = 2 * math.pi * numbers.unsqueeze(-1) * self.frequencies                   # (B, n, k)
        periodic = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)                # (B, n, 2k)
        # one linear map per column as a batched matmul over columns (exports as MatMul); the same sum as a
        # broadcast product, ~5x faster to train on a small batch (64 rows, 16 columns)
        mapped = torch.bmm(periodic.transpose(0, 1), self.weight).transpose(0, 1)            # (B, n, d)
        return torch.relu(mapped + self.bias).flatten(1)


class PeriodicMLP(nn.Module):
    """Preprocessor -> periodic numeric embeddings + categorical embeddings -> [Linear, ReLU, Dropout]* -> logits."""

    Config = PeriodicMLPConfig
    default_lr = 3e-3   # the plain MLP's: the same body, trained by the same schedule
    modality = "table"
    auto = "compared"   # below train.cv_max_rows `auto` compares it out of fold with the other compared families

    def __init__(self, layout: FeatureLayout, **hyper: Any):
        """`hyper`: PeriodicMLPConfig's fields; its defaults fill the rest."""
        super().__init__()
        config = PeriodicMLPConfig(**hyper)
        self.preprocess = TabularPreprocessor(layout, config.embedding_dim)
        columns = len(layout.numeric_index)
        self.periodic = PeriodicEmbeddings(columns, config.frequencies, config.numeric_dim, config.sigma) \
            if columns else None
        width = columns * config.numeric_dim + config.embedding_dim * len(layout.cardinalities)
        self.body = mlp_body(width, config.hidden, config.dropout, layout.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        numbers, embedded = self.preprocess.parts(x)
        parts = ([self.periodic(numbers)] if self.periodic is not None else []) + embedded
        return self.body(torch.cat(parts, dim=1))


MODELS = {"mlp_plr": PeriodicMLP}   # the name(s) `train.model` selects (gathered by models/__init__.py)
