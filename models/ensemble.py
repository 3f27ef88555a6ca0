"""Cross-validation members served as one module: the average of their class probabilities.

The output is log(mean_k softmax(member_k(x) / T)): "logits" whose softmax is exactly the members' mean
probability, so every consumer that applies softmax to logits (the raw-row front, parity gates, distillation,
bless) serves the average without knowing it is an ensemble, and argmax is the averaged vote."""
from __future__ import annotations

import math

import torch
from torch import nn


class FoldEnsemble(nn.Module):
    """(B, F) raw floats -> (B, C) log mean probability of `members`, each at temperature `temperature`."""

    def __init__(self, members: list[nn.Module], temperature: float = 1.0):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)
        # A buffer, not a parameter: saved with the weights and carried into the exported graph, never trained here.
        self.register_buffer("temperature", torch.tensor(float(temperature)))
        self.log_count = math.log(len(members))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = torch.stack([torch.log_softmax(m(x).float() / self.temperature, dim=1)
                                 for m in self.members])                  # (K, B, C)
        return torch.logsumexp(log_probs, dim=0) - self.log_count         # (B, C): log of the mean probability
