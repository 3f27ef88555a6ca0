"""`train.model` and `train.model_args` checked against the models: each built-in model's Config dataclass (in its
own file in models/) types its arguments and fills in its defaults.

Apart from the params on purpose: this imports the models (torch), and loading params must not (most steps and
the service never touch torch). `torchship run` and `plan` check before anything runs; the stages that build a
model check when they take its arguments.
"""
from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from pydantic import TypeAdapter, ValidationError

from models import MODELS
from tasks.core.errors import ConfigError
from tasks.core.params_spec import AUTO, TrainParams

FIX_MODEL_ARGS = " Fix it in params.yaml or your --set, see docs/configuration.md."


def model_configs() -> dict[str, type]:
    """Built-in model name -> its Config dataclass, declared in its own file in models/."""
    return {name: model.Config for name, model in MODELS.items()}


def known_model(name: str) -> None:
    builtin = model_configs()
    if ":" not in name and name not in builtin:
        raise ConfigError(f"train.model: unknown model '{name}'; known: {AUTO}, {', '.join(builtin)} "
                          "(or package.module:Class for your own nn.Module)." + FIX_MODEL_ARGS)


def model_kwargs(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A built-in model's arguments checked against its Config, with its defaults filled in, or a user model's
    dict as given. A key the model does not take is an error, never ignored."""
    known_model(name)
    if ":" in name:
        return dict(args)
    config = model_configs()[name]
    takes = [f.name for f in fields(config)]
    unknown = sorted(set(args) - set(takes))
    if unknown:
        raise ConfigError(f"train.model_args.{name} {unknown} are not arguments of {name} (it takes: "
                          f"{', '.join(takes)})." + FIX_MODEL_ARGS)
    try:
        return asdict(TypeAdapter(config).validate_python(args))
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or name}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"train.model_args.{name} is invalid: {wrong} (got {args!r})." + FIX_MODEL_ARGS) from None


def check_model_args(train: TrainParams) -> None:
    """Every model named in `train` exists and each of its `model_args` entries is one its model takes."""
    if train.model != AUTO:
        known_model(train.model)
    for name, args in train.model_args.items():
        model_kwargs(name, args)


def chosen_model_kwargs(train: TrainParams) -> dict[str, Any]:
    """The chosen model's constructor arguments (defaults filled in for a built-in model)."""
    if train.model == AUTO:
        raise ValueError("train.model is auto: resolve it for the data first (tasks/training/adapt.py)")
    return model_kwargs(train.model, train.model_args.get(train.model, {}))
