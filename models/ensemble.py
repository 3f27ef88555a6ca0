"""Cross-validation members served as one module: the average of their class probabilities, optionally
temperature-scaled.

The output is log(mean_k softmax(member_k(x))) / T: "logits" whose softmax is the members' mean probability
(exactly, at T = 1), so every consumer that applies softmax to logits (the raw-row front, parity gates, distillation,
bless) serves the average without knowing it is an ensemble. T rescales the averaged log-probabilities, so it
changes confidence, never the argmax: softmax(log p / T) is proportional to p ** (1 / T)."""
from __future__ import annotations

import math

import torch
from torch import nn


class FoldEnsemble(nn.Module):
    """(B, F) raw floats -> (B, C) log mean probability of `members`, divided by `temperature`."""

    def __init__(self, members: list[nn.Module], temperature: float = 1.0):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if temperature <= 0:
            raise ValueError(f"temperature {temperature} must be positive")
        self.members = nn.ModuleList(members)
        # A buffer, not a parameter: saved with the weights and carried into the exported graph, never trained here.
        self.register_buffer("temperature", torch.tensor(float(temperature)))
        self.log_count = math.log(len(members))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = torch.stack([torch.log_softmax(m(x).float(), dim=1) for m in self.members])   # (K, B, C)
        log_mean = torch.logsumexp(log_probs, dim=0) - self.log_count                           # (B, C)
        return log_mean / self.temperature
