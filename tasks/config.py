"""The one typed configuration, loaded from params.yaml: this module reads and validates the file into its sections.
Each section has one home: a step's section is specified in tasks/core/params_spec.py; a modality's own section
(`images:`, ...) and its `contract:` spec are its package's (tasks/modalities/<name>/: its `Modality` names them).
The loader joins them into one `Params` model, so a new modality adds its section without editing this file."""
from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Discriminator, Tag, ValidationError, create_model, model_validator

from tasks.core.errors import ConfigError
from tasks.core.params_spec import AUTO, Params
from tasks.modalities import fallback_modality, registered_modalities

PARAMS_FILE = "params.yaml"


def parse_params(raw: dict[str, Any], origin: str = PARAMS_FILE, root: Path = Path(".")) -> Params:
    """Validate a params mapping; errors name the key, the rule and what to do. (`root`: the project folder, kept
    for callers that load another project's params.)"""
    raw = raw or {}
    model = params_model()
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            # a contract's union tag (its modality) is no key of the file
            loc = [p for i, p in enumerate(err["loc"]) if not (i == 1 and err["loc"][0] == "contract")]
            key = ".".join(str(p) for p in loc).replace("validate_", "validate") or "(top level)"
            if not loc:   # a rule across sections: its message names the keys
                lines.append(err["msg"].removeprefix("Value error, "))
            elif err["type"] == "extra_forbidden":
                section = _section_fields(model, err["loc"][:-1])
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


def _contract_modality(value: Any) -> str:
    """Which modality's contract a `contract:` section is: its `modality` key (none: the fallback's, tables)."""
    modality = value.get("modality") if isinstance(value, dict) else getattr(value, "modality", None)
    return modality if modality in registered_modalities() else fallback_modality().name


def _checked(params: Params) -> Params:
    """Across sections: `data.modality` names a modality, and `data.target` agrees with the contract's target."""
    if params.data.modality != AUTO and params.data.modality not in registered_modalities():
        raise ValueError(f"data.modality '{params.data.modality}' is no modality; choose {AUTO} or one of "
                         f"{', '.join(sorted(registered_modalities()))}")
    declared = getattr(params.contract, "target", None)
    if declared and params.data.target and params.data.target != declared:
        raise ValueError(f"data.target '{params.data.target}' differs from contract.target '{declared}'")
    return params


@cache
def params_model() -> type[Params]:
    """`Params` with each modality's own section (defaults when params.yaml has none) and `contract:`, any one of
    the modalities' contract specs (chosen by its `modality` key)."""
    fields: dict[str, Any] = {}
    contracts = []
    for name, modality in registered_modalities().items():
        if modality.section and modality.section not in Params.model_fields:
            fields[modality.section] = (modality.settings, modality.settings())
        if modality.contract is not None:
            contracts.append(Annotated[modality.contract, Tag(name)])
    if len(contracts) > 1:
        fields["contract"] = (Annotated[_union(contracts), Discriminator(_contract_modality)] | None, None)
    elif contracts:
        fields["contract"] = (contracts[0] | None, None)
    return create_model("Params", __base__=Params, __validators__={"checked": model_validator(mode="after")(_checked)},
                        **fields)


def _union(members: list):
    """`members[0] | members[1] | ...` as one type."""
    union = members[0]
    for member in members[1:]:
        union = union | member
    return union


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
    return parse_params(read_params_file(path), origin=str(path), root=Path(path).parent)


def default_params() -> Params:
    """Every section at its defaults (what an empty params.yaml gives)."""
    return parse_params({}, origin="the defaults")
