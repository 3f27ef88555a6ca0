"""What the export stage traces of a text model: (B, T) token ids in; its logits and a small fixed random projection
of its own embedding out (the served graph's string front end is tasks/modalities/text/graph.py, which stays free
of torch: the service imports it and never traces)."""
from __future__ import annotations

import math

import torch
from torch import nn

from tasks.modalities.text.graph import PROJECTED


class ServedTextModel(nn.Module):
    """(B, T) int64 ids -> (logits (B, C), embedding projection (B, k)): what the export stage traces. The embedding
    is the model's own `logits_and_embedding` second output, or its logits where it has none."""

    def __init__(self, model: nn.Module, example: torch.Tensor, seed: int = 0):
        super().__init__()
        self.model = model
        with torch.no_grad():
            width = self.features(example)[1].shape[-1]
        k = min(PROJECTED, width)
        gaussian = torch.randn(width, k, generator=torch.Generator().manual_seed(seed))
        self.register_buffer("projection", gaussian / math.sqrt(k))

    def features(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, the embedding to project) of the wrapped model."""
        if hasattr(self.model, "logits_and_embedding"):
            return self.model.logits_and_embedding(ids)
        logits = self.model(ids)
        return logits, logits

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, embedding = self.features(ids)
        return logits, embedding.float() @ self.projection
