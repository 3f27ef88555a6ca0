"""Cross-validation members served as one module: the average of their class probabilities, optionally
temperature-scaled.

The output is log(mean_k softmax(member_k(x))) / T: "logits" whose softmax is the members' mean probability
(exactly, at T = 1), so every consumer that applies softmax to logits (the raw-row front, parity gates, distillation,
bless) serves the average without knowing it is an ensemble. T rescales the averaged log-probabilities, so it
changes confidence, never the argmax: softmax(log p / T) is proportional to p ** (1 / T). An optional per-class
`class_bias` is then added: the log class priors that turn members trained with class-balanced weights into the
decision of unweighted ones (or back), when out-of-fold evidence says that pays (tasks/training/decision.py)."""
from __future__ import annotations

import math

import torch
from torch import nn


class FoldEnsemble(nn.Module):
    """(B, F) raw floats -> (B, C) log mean probability of `members`, divided by `temperature`."""

    def __init__(self, members: list[nn.Module], temperature: float = 1.0, class_bias: list[float] | None = None):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if temperature <= 0:
            raise ValueError(f"temperature {temperature} must be positive")
        self.members = nn.ModuleList(members)
        # A buffer, not a parameter: saved with the weights and carried into the exported graph, never trained here.
        self.register_buffer("temperature", torch.tensor(float(temperature)))
        self.log_count = math.log(len(members))
        # Only when given: ensembles saved without it load as before (their state dicts have no such key).
        if class_bias is not None:
            self.register_buffer("class_bias", torch.tensor(class_bias, dtype=torch.float32))   # (C,)
        else:
            self.class_bias = None

    def combine(self, member_logits: list[torch.Tensor]) -> torch.Tensor:
        log_probs = torch.stack([torch.log_softmax(z.float(), dim=1) for z in member_logits])   # (K, B, C)
        log_mean = torch.logsumexp(log_probs, dim=0) - self.log_count                           # (B, C)
        scaled = log_mean / self.temperature
        return scaled if self.class_bias is None else scaled + self.class_bias

    def logits_and_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ensemble's logits and the mean of its members' embeddings (members with `logits_and_embedding`
        only: an image model's, which the served graph outputs beside the logits)."""
        pairs = [m.logits_and_embedding(x) for m in self.members]
        return self.combine([z for z, _ in pairs]), torch.stack([e.float() for _, e in pairs]).mean(dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combine([m(x) for m in self.members])
