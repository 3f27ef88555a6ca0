"""What a study searches and what it holds fixed: the `sweep.space` keys checked against the params, each trial's
values drawn from Optuna, written over the study's base params, and the fingerprint of what defines the splits."""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from tasks.core.errors import ConfigError
from tasks.core.params_spec import Params, SearchRange

# The sections a trial's train stage reads besides its data: what a search may vary.
SEARCHABLE = ("prepare.", "train.", "images.augment.")
# What defines the training, validation and holdout rows: fixed for a study, so every trial sees the same splits.
SPLIT_KEYS = ("data", "prepare.seed", "prepare.val_fraction", "prepare.holdout_fraction", "contract")


def check_space(space: dict[str, SearchRange], params: Params) -> None:
    """Refuse a key no trial could vary: outside the searchable sections, a split-defining param, or no param."""
    problems = []
    for key in space:
        if key.startswith(tuple(f"{fixed}." for fixed in SPLIT_KEYS)) or key in SPLIT_KEYS:
            problems.append(f"{key} defines the splits (fixed for a study: every trial must see the same rows)")
        elif not key.startswith(SEARCHABLE):
            problems.append(f"{key} is not read by the train stage or those before it (searchable: "
                            f"{', '.join(s + '*' for s in SEARCHABLE)})")
        elif not _names_a_param(params.model_dump(by_alias=True), key.split(".")):
            problems.append(f"{key} is no param (see docs/configuration.md)")
    if problems:
        raise ConfigError("sweep.space: " + "; ".join(problems) + ".")


def _names_a_param(tree: Any, parts: list[str]) -> bool:
    """Whether `parts` walks the params to a value; below a free-form mapping (train.model_args) any key does."""
    for i, part in enumerate(parts):
        if not isinstance(tree, dict):
            return False
        if part not in tree:
            return i > 0 and parts[i - 1] == "model_args" or (i > 1 and parts[i - 2] == "model_args")
        tree = tree[part]
    return True


def _choice(value: Any) -> Any:
    """Optuna's categorical choices are scalars: a list (hidden sizes) is kept as its JSON text."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _value(value: Any) -> Any:
    """A choice as the params hold it (JSON text back to its list)."""
    if isinstance(value, str) and value[:1] in "[{":
        return json.loads(value)
    return value


def draw(trial, space: dict[str, SearchRange], held: dict[str, Any]) -> dict[str, Any]:
    """The trial's values: suggested by the study, except those `held` (trial 0's values no range holds, such as
    `train.lr: null`, which are applied as they are and never told to the sampler)."""
    values = {}
    for key, entry in space.items():
        if key in held:
            values[key] = held[key]
        elif entry.choices is not None:
            values[key] = _value(trial.suggest_categorical(key, [_choice(value) for value in entry.choices]))
        elif isinstance(entry.low, int) and isinstance(entry.high, int):
            values[key] = trial.suggest_int(key, entry.low, entry.high, log=entry.log)
        else:
            values[key] = trial.suggest_float(key, float(entry.low), float(entry.high), log=entry.log)
    return values


def in_space(entry: SearchRange, value: Any) -> bool:
    """Whether the sampler can record `value` for this entry."""
    if entry.choices is not None:
        return _choice(value) in [_choice(choice) for choice in entry.choices]
    integral = isinstance(entry.low, int) and isinstance(entry.high, int)
    number = isinstance(value, int if integral else (int, float)) and not isinstance(value, bool)
    return number and entry.low <= value <= entry.high


def enqueued(space: dict[str, SearchRange], values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trial 0's values split into (params the study can record, those it cannot: outside the space, held)."""
    fits, held = {}, {}
    for key, entry in space.items():
        value = values.get(key)
        if in_space(entry, value):
            fits[key] = _choice(value)
        else:
            held[key] = value
    return fits, held


def read_values(raw: dict, keys: list[str]) -> dict[str, Any]:
    """The values of dotted `keys` in a params mapping (None where a key is unset: a model's own default)."""
    values = {}
    for key in keys:
        node: Any = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        values[key] = node
    return values


def _holds(tree: Any, parts: list[str]) -> bool:
    """Whether the mapping names the dotted key (a null value included)."""
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def with_values(raw: dict, values: dict[str, Any]) -> dict:
    """A copy of the params mapping with each dotted key set; None for a key the mapping does not hold leaves it
    unset (trial 0 of params that never named it: its default, not a null it may not take)."""
    merged = copy.deepcopy(raw)
    for key, value in values.items():
        if value is None and not _holds(raw, key.split(".")):
            continue
        *sections, last = key.split(".")
        node = merged
        for part in sections:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"sweep.space: {key}: '{part}' is not a section.")
            node = child
        node[last] = value
    return merged


def splits_fingerprint(params: Params) -> str:
    """A hash of what defines the splits: a study resumed on other splits is refused."""
    fixed = {"data": params.data.model_dump(), "prepare": params.prepare.model_dump(
        include={"seed", "val_fraction", "holdout_fraction"}), "contract": params.contract and
        params.contract.model_dump()}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]
