"""Model definitions and the name -> constructor registry (torch only: no I/O, no tracking)."""
from __future__ import annotations

import importlib
from typing import Any, Callable

from torch import nn

from models.ft_transformer import FTTransformer
from models.tabular import FeatureLayout, TabularMLP, TabularPreprocessor

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": TabularMLP,
    "ft_transformer": FTTransformer,
}


def build_model(name: str, layout: FeatureLayout, **kwargs: Any) -> nn.Module:
    """Construct a registered model, or a user's `package.module:Class` called as Class(layout, **kwargs).
    Unknown names list the known ones."""
    if ":" in name:
        module_name, _, class_name = name.partition(":")
        try:
            constructor = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"model '{name}' cannot be imported ({exc}); give package.module:Class on the "
                           "Python path, or one of: " + ", ".join(sorted(MODELS))) from None
        return constructor(layout, **kwargs)
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}'; known models: {', '.join(sorted(MODELS))} "
                       "(or package.module:Class for your own nn.Module)")
    return MODELS[name](layout, **kwargs)


__all__ = ["FTTransformer", "FeatureLayout", "MODELS", "TabularMLP", "TabularPreprocessor", "build_model"]
