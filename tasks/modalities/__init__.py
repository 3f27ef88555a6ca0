"""One package per kind of data, each behind one interface (tasks/modalities/interface.py `Modality`): the steps,
the service and the monitor call its methods and never ask which kind of data they have.

A modality is a sub-package here whose `__init__.py` declares `MODALITY = <its Modality>` at its top level: found by
that mark on first use, as models/ finds its model files by `MODELS`, so a new kind of data is a package and no list
elsewhere names it. tasks/stages/code_deps.py adds the configured modality's package to each stage's code deps (and
only it). Its request decoding is the package's `serving` module, which declares `SERVING = <its decoding>`: the
one part of a modality the service imports."""
from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.core import paths
from tasks.core.errors import ConfigError
from tasks.core.params_spec import AUTO

if TYPE_CHECKING:
    from tasks.modalities.interface import Holdout, Modality

REGISTERS = re.compile(r"^MODALITY\b", re.M)   # a modality package's mark (tasks/stages/code_graph.py reads it too)
SERVES = re.compile(r"^SERVING\b", re.M)       # its serving part's mark
HERE = Path(__file__).parent


def package_names() -> list[str]:
    """The modality packages, by their source's mark (nothing imported)."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if info.ispkg
                  and REGISTERS.search((HERE / info.name / "__init__.py").read_text()))


@cache
def registered_modalities() -> dict[str, Modality]:
    """name -> modality, from every package's `MODALITY`; a name two packages claim is refused."""
    return {name: importlib.import_module(f"{__name__}.{package}").MODALITY for name, package in _packages().items()}


@cache
def _packages() -> dict[str, str]:
    """modality name -> its package's name."""
    found: dict[str, str] = {}
    for package in package_names():
        name = importlib.import_module(f"{__name__}.{package}").MODALITY.name
        if name in found:
            raise ValueError(f"modality '{name}' is declared twice: by {package} and by {found[name]}")
        found[name] = package
    return found


def package_of(name: str) -> str:
    """The package (under tasks/modalities/) of modality `name`."""
    modality_named(name)   # an unknown name is told as such
    return _packages()[name]


def modality_named(name: str) -> Modality:
    """The modality called `name`; an unknown name lists the known ones."""
    found = registered_modalities()
    if name not in found:
        raise ConfigError(f"unknown modality '{name}'; known: {', '.join(sorted(found))} (or `{AUTO}`)")
    return found[name]


def modality_of(schema) -> Modality:
    """The modality a model's schema was prepared by (a schema that names none: the fallback's)."""
    return modality_named(schema.modality) if schema.modality else fallback_modality()


def input_signature(schema) -> list[tuple[str, str]]:
    """A model's input signature by its modality: two models are comparable only when theirs match."""
    return [("modality", schema.modality), *modality_of(schema).input_signature(schema)]


def fallback_modality() -> Modality:
    """The modality of a source no other claims (and of a model class that names none)."""
    return next(m for m in registered_modalities().values() if m.fallback)


def detect_modality(data, params: Any = None) -> Modality:
    """`data.modality` when it names one; with `auto`, the first modality (by name) whose `claims` says the source is
    its kind, else the fallback."""
    if data.modality != AUTO:
        return modality_named(data.modality)
    claiming = [m for m in registered_modalities().values() if not m.fallback and m.claims(data, params)]
    return claiming[0] if claiming else fallback_modality()


def modality_of_model(model_class) -> Modality:
    """The modality a model class takes (its `modality` attribute; none: the fallback's)."""
    name = getattr(model_class, "modality", None)
    return modality_named(name) if name else fallback_modality()


@cache
def serving_part(name: str):
    """The request decoding of modality `name` (the `SERVING` of its package's `serving` module), imported by name:
    the service's one way into a modality, and no stage's code dep."""
    return importlib.import_module(f"{__name__}.{package_of(name)}.serving").SERVING


def modality_sections(params) -> dict[str, dict]:
    """Each modality's own params section (`images`, ...) as plain values: what a serving host holds its models'
    requests to (they may only tighten the limits a model was trained under)."""
    return {m.section: getattr(params, m.section).model_dump() for m in registered_modalities().values() if m.section}


def load_holdout(schema, path: Path | None = None) -> Holdout:
    """The labelled holdout every comparison uses (compress, profile, bless, canary, the monitor), read by the
    schema's modality."""
    return modality_of(schema).load_holdout(schema, path or paths.HOLDOUT_SPLIT)
