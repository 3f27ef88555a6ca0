"""Tiny prepared and encoded customers, shared by the model tests."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from models.tabular import FeatureLayout
from tasks.core.labels import encode_target
from tasks.core.params_spec import PrepareParams, TrainParams
from tasks.modalities.table.encoding import encode_features
from tasks.modalities.table.layout import fit_layout
from tasks.modalities.table.prepare import PreparedData, prepare_tables
from tasks.training.loop import Split


@dataclass(frozen=True)
class Encoded:
    prepared: PreparedData
    train: Split
    val: Split
    layout: FeatureLayout


def encode_split(frame, schema) -> Split:
    return Split(torch.from_numpy(encode_features(frame, schema)),
                 torch.from_numpy(encode_target(frame[schema.target], schema)))


@pytest.fixture(scope="session")
def encoded(customers) -> Encoded:
    torch.set_num_threads(1)  # tiny matrices: extra threads only add overhead on small CPUs
    prepared = prepare_tables(customers, "churned", "synthetic", PrepareParams(seed=0))
    train = encode_split(prepared.train, prepared.schema)
    return Encoded(prepared, train, encode_split(prepared.val, prepared.schema),
                   fit_layout(train.features.numpy(), prepared.schema))


@pytest.fixture(scope="session")
def tiny_train() -> TrainParams:
    """A few quick epochs of a small MLP."""
    return TrainParams(model="mlp", model_args={"mlp": {"hidden": [32], "embedding_dim": 4, "dropout": 0.0}}, epochs=6,
                       batch_size=128, lr=0.01, warmup_fraction=0.1, patience=6, seed=0)
