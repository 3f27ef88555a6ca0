"""Model definitions and the name -> constructor registry (torch only: no I/O, no tracking)."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from models.tabular import FeatureLayout, TabularMLP, TabularPreprocessor

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": TabularMLP,
}


def build_model(name: str, layout: FeatureLayout, **kwargs: Any) -> nn.Module:
    """Construct a registered model; unknown names list the known ones."""
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}'; known models: {', '.join(sorted(MODELS))}")
    return MODELS[name](layout, **kwargs)


__all__ = ["FeatureLayout", "MODELS", "TabularMLP", "TabularPreprocessor", "build_model"]
