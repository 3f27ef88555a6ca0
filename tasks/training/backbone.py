"""The frozen pretrained backbone's features: what the linear-probe baseline fits on (a fine-tune must beat a linear
classifier on the features it started from). Any modality whose model has `embed(x)`."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tasks.core.errors import ConfigError
from tasks.core.params_spec import AUTO, Params
from tasks.core.schema_spec import Schema
from tasks.modalities import modality_of

CHUNK = 512   # items embedded at once


def probe_features(params: Params, schema: Schema, train_inputs: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """inputs -> the frozen pretrained backbone's embeddings, its layout fitted on the training split."""
    import torch

    from models import build_model
    from tasks.training.adapt import pick_model
    from tasks.training.model_args import chosen_model_kwargs
    from tasks.training.pretrained import load_pretrained

    modality = modality_of(schema)
    settings = params.train
    if settings.model == AUTO:   # the family the train stage will pick for this many rows
        picked, _ = pick_model(settings, len(train_inputs), modality, modality.large_from(params))
        settings = settings.model_copy(update={"model": picked})
    model = build_model(settings.model, modality.fit_layout(train_inputs, schema), **chosen_model_kwargs(settings))
    embed = getattr(model, "embed", None)
    if embed is None:   # before the weights are read: the run fails at once
        raise ConfigError(f"train.model {settings.model} has no embed(x) method: the linear probe of "
                          "train.pretrained needs the backbone's features (docs/own-model.md).")
    load_pretrained(model, params.train.pretrained)
    model.eval()

    def features(inputs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return torch.cat([embed(torch.from_numpy(inputs[i:i + CHUNK])).float()
                              for i in range(0, len(inputs), CHUNK)]).numpy()

    return features


def keep_frozen_in_eval(model) -> None:
    """Modules without a trainable parameter of their own stay in eval mode while the rest trains: a frozen
    backbone's batch norms keep normalising with their pretrained statistics, as the linear probe saw them."""
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own and not any(p.requires_grad for p in own):
            module.eval()
