"""FT-Transformer (Gorishniy et al., 2021): each feature becomes a token, a transformer mixes them,
the CLS token classifies. A stronger (and slower) tabular model than the MLP: the distillation teacher."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from models.tabular import FeatureLayout, TabularPreprocessor


@dataclass(frozen=True)
class FTTransformerConfig:
    """`train.model_args` of the `ft_transformer` model (feature tokens + transformer + CLS head)."""

    d_token: int = field(default=32, metadata={"doc": "Width of each feature token (a multiple of heads)."})
    layers: int = field(default=2, metadata={"doc": "Transformer blocks."})
    heads: int = field(default=4, metadata={"doc": "Attention heads per block."})
    dropout: float = field(default=0.1, metadata={"doc": "Dropout in attention and feed-forward layers."})
    ffn_factor: int = field(default=2, metadata={"doc": "Feed-forward width as a multiple of d_token."})

    def __post_init__(self):
        small = [f"{name} {getattr(self, name)}" for name in ("d_token", "layers", "heads", "ffn_factor")
                 if getattr(self, name) < 1]
        if small:
            raise ValueError(f"{', '.join(small)}: each must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")
        if self.d_token % self.heads:
            raise ValueError(f"d_token {self.d_token} must be a multiple of heads {self.heads}")


class Block(nn.Module):
    """Pre-norm self-attention + feed-forward, written out so every exporter sees plain ops."""

    def __init__(self, d_token: int, heads: int, dropout: float, ffn_factor: int):
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(d_token)
        self.qkv = nn.Linear(d_token, 3 * d_token)
        self.out = nn.Linear(d_token, d_token)
        self.ffn_norm = nn.LayerNorm(d_token)
        self.ffn = nn.Sequential(nn.Linear(d_token, ffn_factor * d_token), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(ffn_factor * d_token, d_token))
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = h.shape                                          # (B, T, D)
        q, k, v = self.qkv(self.attention_norm(h)).chunk(3, dim=-1)
        split = lambda t: t.reshape(batch, tokens, self.heads, width // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)                                   # (B, H, T, D/H)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(width // self.heads), dim=-1)
        mixed = (self.dropout(weights) @ v).transpose(1, 2).reshape(batch, tokens, width)
        h = h + self.dropout(self.out(mixed))
        return h + self.dropout(self.ffn(self.ffn_norm(h)))


class FTTransformer(nn.Module):
    """Preprocessor -> feature tokens (numeric: x * w_j + b_j; categorical: embeddings) + CLS ->
    transformer blocks -> LayerNorm -> linear head on CLS -> logits (B, n_classes)."""

    Config = FTTransformerConfig
    # The peak AdamW learning rate that trained it best in the measurements behind `auto`
    # (bench/results/auto_model.json); `train.lr` overrides it.
    default_lr = 1e-3
    modality = "table"
    auto = "large"   # `auto` trains it from train.ft_min_rows training rows (bench/results/auto_model.json)

    def __init__(self, layout: FeatureLayout, **hyper: Any):
        """`hyper`: FTTransformerConfig's fields; its defaults fill the rest."""
        super().__init__()
        config = FTTransformerConfig(**hyper)
        d_token = config.d_token
        self.preprocess = TabularPreprocessor(layout, embedding_dim=d_token)
        n_numeric = len(layout.numeric_index)
        self.numeric_weight = nn.Parameter(torch.randn(n_numeric, d_token) / math.sqrt(d_token))
        self.numeric_bias = nn.Parameter(torch.zeros(n_numeric, d_token))
        self.cls = nn.Parameter(torch.zeros(1, 1, d_token))
        self.blocks = nn.ModuleList(Block(d_token, config.heads, config.dropout, config.ffn_factor)
                                    for _ in range(config.layers))
        self.norm = nn.LayerNorm(d_token)
        self.head = nn.Linear(d_token, layout.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        numbers, embedded = self.preprocess.parts(x)
        return self._transform(numbers, torch.stack(embedded, dim=1) if embedded else None)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """The network alone, on already preprocessed (B, n_num + n_cat * D) inputs (see TabularPreprocessor)."""
        n_numeric, d_token = self.numeric_weight.shape[0], self.cls.shape[-1]
        numbers = features[:, :n_numeric] if self.preprocess.has_numeric else None
        embedded = (features[:, n_numeric:].reshape(features.shape[0], -1, d_token) if len(self.preprocess.embeddings)
                    else None)
        return self._transform(numbers, embedded)

    def _transform(self, numbers: torch.Tensor | None, embedded: torch.Tensor | None) -> torch.Tensor:
        batch = (numbers if numbers is not None else embedded).shape[0]
        tokens = [self.cls.expand(batch, -1, -1)]                                # (B, 1, D)
        if numbers is not None:
            tokens.append(numbers.unsqueeze(-1) * self.numeric_weight + self.numeric_bias)  # (B, n_num, D)
        if embedded is not None:
            tokens.append(embedded)                                              # (B, n_cat, D)
        h = torch.cat(tokens, dim=1)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, 0]))


MODELS = {"ft_transformer": FTTransformer}   # the name(s) `train.model` selects (gathered by models/__init__.py)
