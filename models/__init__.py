"""Model definitions and the name -> constructor registry (torch only: no I/O, no tracking).

Each model file declares what is known about its model beside it: a `Config` dataclass (its hyper-parameters,
their defaults and rules: `train.model_args.<name>`), a `default_lr`, the `modality` it takes, its `auto` role (what
`train.model: auto` picks it for) and `MODELS`, the name(s) `train.model` selects it by. The registry is every
model file's `MODELS`, found here on first use: a new model family is its file, and no list elsewhere names it."""
from __future__ import annotations

import importlib
import pkgutil
import re
import traceback
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import nn

# AdamW's usual peak learning rate, for a `package.module:Class` model that declares no `default_lr` of its own.
FALLBACK_LR = 1e-3
# A model file says so at its top level; only those are imported (a user's own file here stays unimported until
# `train.model` names it). tasks/stages/code_graph.py reads the same mark for each stage's code deps.
REGISTERS = re.compile(r"^MODELS\b", re.M)


def registered_models() -> dict[str, Callable[..., nn.Module]]:
    """name -> class, by name, from the `MODELS` of every module of this package that declares one; a name two files
    claim is refused."""
    found: dict[str, Callable[..., nn.Module]] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if not REGISTERS.search((Path(__file__).parent / f"{module_info.name}.py").read_text()):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for name, model in getattr(module, "MODELS", {}).items():
            if name in found:
                raise ValueError(f"model name '{name}' is registered twice: {found[name].__module__} and "
                                 f"{module.__name__}")
            found[name] = model
    return dict(sorted(found.items()))


class ModelRegistry(Mapping[str, Callable[..., nn.Module]]):
    """`registered_models()`, found on first use rather than at import: importing this package (every step that
    reads a model's `default_lr` or builds one does) imports no model file until a model is asked for."""

    @cached_property
    def _found(self) -> dict[str, Callable[..., nn.Module]]:
        return registered_models()

    def __getitem__(self, name: str) -> Callable[..., nn.Module]:
        return self._found[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._found)

    def __len__(self) -> int:
        return len(self._found)


MODELS = ModelRegistry()


def model_class(name: str) -> Callable[..., nn.Module]:
    """A registered model, or a user's `package.module:Class`. Unknown names list the known ones."""
    if ":" in name:
        module_name, _, class_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            missing = getattr(exc, "name", None)   # ModuleNotFoundError: which module was not found
            if isinstance(exc, ImportError) and missing and f"{module_name}.".startswith(f"{missing}."):
                raise KeyError(f"model '{name}' cannot be imported ({exc}); give package.module:Class on the "
                               "Python path, or one of: " + ", ".join(sorted(MODELS))) from None
            # the module's own code failed: a SyntaxError, a NameError at its top level, an import inside it
            raise KeyError(f"model '{name}': importing {module_name} raised {type(exc).__name__} at "
                           f"{failed_at(exc)}: {exc}") from None
        if not hasattr(module, class_name):
            raise KeyError(f"model '{name}' cannot be imported: {module_name} has no {class_name}")
        return getattr(module, class_name)
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}'; known models: {', '.join(sorted(MODELS))} "
                       "(or package.module:Class for your own nn.Module)")
    return MODELS[name]


def failed_at(exc: BaseException) -> str:
    """`file, line N` of what raised `exc`: a SyntaxError's own place, else the innermost frame of its traceback."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}, line {exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "its top level"


def build_model(name: str, layout: Any, **kwargs: Any) -> nn.Module:
    """Construct a model by name, called as Class(layout, **kwargs) (layout: models.tabular.FeatureLayout)."""
    return model_class(name)(layout, **kwargs)


def model_modality(name: str) -> str | None:
    """The modality a model takes (its class's `modality`; None: it names none, and takes the fallback's)."""
    return getattr(model_class(name), "modality", None)


def auto_models(modality: str, role: str) -> list[str]:
    """The registered models of `modality` whose class declares `auto = role`, by name: what `train.model: auto`
    picks from (`default`; `large` from a modality's row threshold; `compared` out of fold on small sets)."""
    return [name for name, model in MODELS.items()
            if getattr(model, "modality", None) == modality and getattr(model, "auto", None) == role]


def default_lr(name: str) -> float:
    """The model's own peak learning rate (`default_lr` on its class), else FALLBACK_LR."""
    return float(getattr(model_class(name), "default_lr", FALLBACK_LR))
