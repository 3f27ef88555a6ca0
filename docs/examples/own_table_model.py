"""A table model of your own, as docs/own-model.md describes it:
`train.model: docs.examples.own_table_model:ResidualMLP`.

It meets the table contract: built as ResidualMLP(layout, **train.model_args[name]); forward takes the raw encoded
rows (B, F) float32 with NaN for missing numbers and category codes (0 = unknown), and returns (B, n_classes)
logits. TabularPreprocessor (the built-in models' own) imputes, standardises and embeds inside the module, so the
exported graph carries it."""
from __future__ import annotations

from torch import nn

from models.tabular import TabularPreprocessor


class ResidualMLP(nn.Module):
    """Preprocessor -> Linear -> one residual block -> logits."""

    default_lr = 3e-3   # optional: the peak learning rate when train.lr is null

    def __init__(self, layout, width: int = 64, embedding_dim: int = 8):
        super().__init__()
        self.preprocess = TabularPreprocessor(layout, embedding_dim)
        self.project = nn.Linear(self.preprocess.out_features, width)
        self.block = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.head = nn.Linear(width, layout.n_classes)

    def forward(self, rows):   # any name: the exporters pass the input by position
        hidden = self.project(self.preprocess(rows))
        return self.head(hidden + self.block(hidden))
