"""The one typed configuration, loaded from params.yaml: this module reads and validates the file into the sections,
whose specs are tasks/core/params_spec.py, plus the section a step declares in its own module.

A step's own section: tasks/<step>.py holds its spec (a params_spec.Section) and names it at its top level,
`PARAMS_SECTION = ScoreParams`; the section is `<step>:` in params.yaml. That mark is found in the source, as
models/ finds its model files by `MODELS`. The loader imports a step module only when dvc.yaml names the step, the
core spec lacks a section of that name, and params.yaml holds it: loading the usual params imports no step.
This is the one import of a step from below the steps, and it reads only the spec (never runs the step).
"""
from __future__ import annotations

import importlib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model

from tasks.core.errors import ConfigError
from tasks.core.params_spec import Params, Section

PARAMS_FILE = "params.yaml"
# A step module's mark that it declares its own params.yaml section (see the module docstring).
DECLARES_SECTION = re.compile(r"^PARAMS_SECTION\b", re.M)
STEPS = Path(__file__).parent   # tasks/: where tasks/<step>.py lives


def parse_params(raw: dict[str, Any], origin: str = PARAMS_FILE, root: Path = Path(".")) -> Params:
    """Validate a params mapping (steps' own sections: those of dvc.yaml under `root`); errors name the key, the rule
    and what to do."""
    raw = raw or {}
    model = params_model(raw, root)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            # a contract's union tag (table or image) is no key of the file
            loc = [p for i, p in enumerate(err["loc"]) if not (i == 1 and err["loc"][0] == "contract")]
            key = ".".join(str(p) for p in loc).replace("validate_", "validate") or "(top level)"
            if err["type"] == "extra_forbidden":
                section = _section_fields(model, err["loc"][:-1])
                if len(err["loc"]) == 1:   # a top-level typo: a step's own section is a known key too
                    section += [name for name in declaring_steps(root) if name not in section]
                lines.append(f"unknown key '{key}'" + (f" (known keys here: {', '.join(section)})" if section else ""))
            else:
                lines.append(f"'{key}': {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"{origin} is invalid: " + "; ".join(lines)
                          + ". Fix the key in params.yaml or your --set, see docs/configuration.md.") from None


def _section_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys `model` knows at `loc` (a section's path), [] where that is no section."""
    for part in loc:
        field = model.model_fields.get(part) or model.model_fields.get(f"{part}_")
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return [f.alias or name for name, f in model.model_fields.items()]


def params_model(raw: dict[str, Any], root: Path = Path(".")) -> type[Params]:
    """`Params`, plus a field for each section of `raw` that a step declares in its own module."""
    unknown = [key for key in raw if key not in core_sections()] if isinstance(raw, dict) else []
    if not unknown:   # the usual case: nothing to look up, no dvc.yaml read, no step imported
        return Params
    declared = declaring_steps(root)
    specs = step_sections([name for name in unknown if name in declared])
    return _with_sections(tuple(sorted(specs.items()))) if specs else Params


def core_sections() -> set[str]:
    """The sections tasks/core/params_spec.py specifies, by their params.yaml names."""
    return {field.alias or name for name, field in Params.model_fields.items()}


def declaring_steps(root: Path = Path(".")) -> list[str]:
    """The steps of dvc.yaml under `root` whose module declares its own section (read from the source, not
    imported) and that the core spec lacks; [] without a dvc.yaml."""
    # imported here: dvc.yaml is read only when params.yaml holds a section the core lacks
    from tasks.core.dvc_file import DVC_FILE, read_dvc_file

    if not (root / DVC_FILE).exists():
        return []
    stages = read_dvc_file(root).get("stages") or {}
    return [name for name in stages if name not in core_sections() and name.isidentifier()
            and (source := _step_source(name)) and DECLARES_SECTION.search(source.read_text())]


def _step_source(name: str) -> Path | None:
    """tasks/<name>.py, or tasks/<name>/__init__.py for a step that is a package."""
    return next((path for path in (STEPS / f"{name}.py", STEPS / name / "__init__.py") if path.exists()), None)


def step_sections(names: list[str]) -> dict[str, type[Section]]:
    """name -> the spec each of these steps declares (`PARAMS_SECTION`), importing their modules."""
    specs = {}
    for name in names:
        spec = getattr(_step_module(name), "PARAMS_SECTION", None)
        if not (isinstance(spec, type) and issubclass(spec, Section)):
            raise ConfigError(f"tasks/{name}.py: PARAMS_SECTION must be a Section class (tasks/core/params_spec.py), "
                              f"got {spec!r}.")
        specs[name] = spec
    return specs


def _step_module(name: str):
    """The module tasks/<name>.py, imported once."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == f"tasks.{name}":
        return main   # `python -m tasks.<name>` is running: read its spec there rather than import it a second time
    return importlib.import_module(f"tasks.{name}")


@lru_cache
def _with_sections(specs: tuple[tuple[str, type[Section]], ...]) -> type[Params]:
    """Params with a required field per step section (a name BaseModel already uses gets a trailing `_`, as
    `validate` does)."""
    fields: dict[str, Any] = {}
    for name, spec in specs:
        field = f"{name}_" if hasattr(BaseModel, name) else name
        fields[field] = (spec, Field(alias=name))
    return create_model("Params", __base__=Params, **fields)


def read_params_file(path: str | Path = PARAMS_FILE) -> dict[str, Any]:
    """Read a YAML params file into plain dicts (no validation)."""
    from ruamel.yaml import YAML

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} not found: run torchship from the project root or pass --params PATH.")
    try:
        loaded = YAML(typ="safe").load(path.read_text())
    except Exception as exc:  # ruamel raises many parser error types
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return loaded or {}


def load_params(path: str | Path = PARAMS_FILE) -> Params:
    """Load and validate params.yaml (steps' own sections: those of the dvc.yaml beside it)."""
    return parse_params(read_params_file(path), origin=str(path), root=Path(path).parent)
