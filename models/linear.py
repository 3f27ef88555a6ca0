"""The softmax-linear model: logistic regression as a PyTorch module, on the same in-graph preprocessing as the
MLP, so small tables can pick it on evidence (`train.model: auto`) and export it through the same path."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from models.tabular import FeatureLayout, TabularPreprocessor


@dataclass(frozen=True)
class LinearConfig:
    """`train.model_args` of the `linear` model."""

    embedding_dim: int = field(default=4, metadata={"doc": "Embedding width per categorical column."})

    def __post_init__(self):
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim {self.embedding_dim} must be at least 1")


class SoftmaxLinear(nn.Module):
    """Preprocessor -> one Linear -> logits (B, n_classes): the baseline every table has (logistic regression)."""

    Config = LinearConfig
    # No hidden layers to keep stable: a larger step than the MLP's converges in the same step budget.
    default_lr = 1e-2
    modality = "table"
    auto = "compared"   # below train.cv_max_rows `auto` compares it out of fold with the other compared families

    def __init__(self, layout: FeatureLayout, **hyper: Any):
        """`hyper`: LinearConfig's fields; its defaults fill the rest."""
        super().__init__()
        config = LinearConfig(**hyper)
        self.preprocess = TabularPreprocessor(layout, config.embedding_dim)
        self.body = nn.Linear(self.preprocess.out_features, layout.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.preprocess(x))


MODELS = {"linear": SoftmaxLinear}   # the name(s) `train.model` selects (gathered by models/__init__.py)
