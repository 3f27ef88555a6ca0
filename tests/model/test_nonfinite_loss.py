"""Training stops on a non-finite loss and says at which epoch and step (tasks/training/loop.py), and an epoch whose
validation logits are NaN never becomes the best state, however its macro-F1 (computed on argmax of NaN: class 0)
happens to score."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.core.params_spec import TrainParams
from tasks.training.loop import Split, TrainingDiverged, train_model

SETTINGS = TrainParams(epochs=4, batch_size=16, lr=0.01, patience=10, adapt=False)


def splits() -> tuple[Split, Split]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(96, 4, generator=generator)
    labels = (features[:, 0] > 0).long()
    return Split(features[:64], labels[:64]), Split(features[64:], labels[64:])


class Diverging(nn.Module):
    """Finite until its `after`-th training forward pass, NaN from then on."""

    def __init__(self, after: int):
        super().__init__()
        self.body, self.after, self.calls = nn.Linear(4, 2), after, 0

    def forward(self, x):
        self.calls += self.training
        logits = self.body(x)
        return logits * float("nan") if self.training and self.calls > self.after else logits


class NanInEval(nn.Module):
    """Trains with finite logits; in eval mode answers NaN (argmax reads class 0 for every row)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 2)

    def forward(self, x):
        logits = self.body(x)
        return logits if self.training else torch.full_like(logits, float("nan"))


def test_a_nan_loss_stops_training_naming_its_epoch_and_step():
    train, val = splits()
    with pytest.raises(TrainingDiverged) as stopped:
        train_model(Diverging(after=6), train, val, SETTINGS, n_classes=2)   # 4 steps an epoch: epoch 2, step 3
    message = str(stopped.value)
    assert "epoch 2, step 3 of 4" in message and "nan" in message, message


def test_an_epoch_with_nan_validation_logits_never_becomes_the_best():
    train, val = splits()
    with pytest.raises(TrainingDiverged) as stopped:
        train_model(NanInEval(), train, val, SETTINGS, n_classes=2)
    assert "after epoch 1" in str(stopped.value) and "32 of 32 validation rows" in str(stopped.value)
