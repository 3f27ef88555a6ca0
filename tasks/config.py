"""The one typed configuration, loaded from params.yaml: this module reads and validates the file into the sections,
whose specs (and their one import path) are tasks/core/params_spec.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tasks.core.errors import ConfigError
from tasks.core.params_spec import Params

PARAMS_FILE = "params.yaml"


def parse_params(raw: dict[str, Any], origin: str = PARAMS_FILE) -> Params:
    """Validate a params mapping; errors name the key, the rule and what to do."""
    try:
        return Params.model_validate(raw or {})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            # a contract's union tag (table or image) is no key of the file
            loc = [p for i, p in enumerate(err["loc"]) if not (i == 1 and err["loc"][0] == "contract")]
            key = ".".join(str(p) for p in loc).replace("validate_", "validate") or "(top level)"
            if err["type"] == "extra_forbidden":
                section = _section_fields(err["loc"][:-1])
                lines.append(f"unknown key '{key}'" + (f" (known keys here: {', '.join(section)})" if section else ""))
            else:
                lines.append(f"'{key}': {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"{origin} is invalid: " + "; ".join(lines)
                          + ". Fix the key in params.yaml or your --set, see docs/configuration.md.") from None


def _section_fields(loc: tuple) -> list[str]:
    model: type[BaseModel] = Params
    for part in loc:
        field = model.model_fields.get(part) or model.model_fields.get(f"{part}_")
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return [f.alias or name for name, f in model.model_fields.items()]


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
    """Load and validate params.yaml."""
    return parse_params(read_params_file(path), origin=str(path))
