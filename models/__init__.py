"""Model definitions and the name -> constructor registry (torch only: no I/O, no tracking).

Each model file declares what is known about its model beside it: a `Config` dataclass (its hyper-parameters,
their defaults and rules: `train.model_args.<name>`) and a `default_lr`."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn

from models.cnn import ImageLayout, ImagePreprocessor, ImageResNet, ResNetConfig
from models.ensemble import FoldEnsemble
from models.ft_transformer import FTTransformer, FTTransformerConfig
from models.linear import LinearConfig, SoftmaxLinear
from models.periodic import PeriodicMLP, PeriodicMLPConfig
from models.tabular import FeatureLayout, MLPConfig, TabularMLP, TabularPreprocessor

MODELS: dict[str, Callable[..., nn.Module]] = {
    "linear": SoftmaxLinear,
    "mlp": TabularMLP,
    "mlp_plr": PeriodicMLP,
    "ft_transformer": FTTransformer,
    "resnet": ImageResNet,
}
# AdamW's usual peak learning rate, for a `package.module:Class` model that declares no `default_lr` of its own.
FALLBACK_LR = 1e-3


def model_class(name: str) -> Callable[..., nn.Module]:
    """A registered model, or a user's `package.module:Class`. Unknown names list the known ones."""
    if ":" in name:
        module_name, _, class_name = name.partition(":")
        try:
            return getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"model '{name}' cannot be imported ({exc}); give package.module:Class on the "
                           "Python path, or one of: " + ", ".join(sorted(MODELS))) from None
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}'; known models: {', '.join(sorted(MODELS))} "
                       "(or package.module:Class for your own nn.Module)")
    return MODELS[name]


def build_model(name: str, layout: FeatureLayout, **kwargs: Any) -> nn.Module:
    """Construct a model by name, called as Class(layout, **kwargs)."""
    return model_class(name)(layout, **kwargs)


def model_modality(name: str) -> str:
    """What a model takes: "image" pixels, or "table" rows (a model class without `modality` takes tables)."""
    return str(getattr(model_class(name), "modality", "table"))


def default_lr(name: str) -> float:
    """The model's own peak learning rate (`default_lr` on its class), else FALLBACK_LR."""
    return float(getattr(model_class(name), "default_lr", FALLBACK_LR))


__all__ = ["FALLBACK_LR", "FTTransformer", "FTTransformerConfig", "FeatureLayout", "FoldEnsemble", "ImageLayout",
           "ImagePreprocessor", "ImageResNet", "LinearConfig", "ResNetConfig",
           "MLPConfig", "MODELS", "PeriodicMLP", "PeriodicMLPConfig", "SoftmaxLinear", "TabularMLP",
           "TabularPreprocessor", "build_model", "default_lr", "model_class", "model_modality"]
