"""The generated docs (`torchship config-docs`): docs/configuration.md from the typed configuration (every key, its
type, default and meaning; each modality's own section and contract too, from its package), and the pipeline's
diagram and step table from the stage list (tasks/stages/diagram.py), so the docs can never drift from the code
(tests compare them)."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from pydantic import BaseModel

from tasks.config import params_model
from tasks.modalities import registered_modalities
from tasks.stages.diagram import write_blocks

CONFIGURATION_DOCS = Path("docs") / "configuration.md"


def configuration_markdown(root: Path = Path(".")) -> str:
    """docs/configuration.md, generated from the typed model: every key, type, default, meaning (each modality's
    own section after the steps', then the contract each modality declares)."""
    from tasks.training.model_args import model_configs  # imports torch: only when the docs are built

    lines = ["# Configuration (`params.yaml`)", "",
             "Generated from `tasks/core/params_spec.py` (and each modality's own section and contract from its "
             "package, `tasks/modalities/<name>/`) by `torchship config-docs`; do not edit by hand.",
             "Override any key for one run with `torchship run --set section.key=value`.", ""]
    for section_name, section_field in params_model().model_fields.items():
        if section_name == "contract":
            continue
        lines += _section_table(section_field.alias or section_name, section_field.annotation)
        if section_name == "train":
            for model, config in model_configs().items():
                lines += _config_table(f"train.model_args.{model}", config)
    lines += ["## `contract`", "", "Optional, one per project: the data contract of its modality (null = the "
              "modality's own rules from the params). Propose one with `torchship contract suggest DATA`; the "
              "`modality` key says which (none: a table's).", ""]
    for name, modality in registered_modalities().items():
        if modality.contract is not None:
            lines += _section_table("contract", modality.contract, f"`contract` of the {name} modality")
    return "\n".join(lines)


def _section_table(key: str, section: type[BaseModel], title: str | None = None) -> list[str]:
    lines = [f"## {title or f'`{key}`'}", "", inspect.cleandoc(section.__doc__ or ""), "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in section.model_fields.items():
        kind = (str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
                .replace(" | ", " or "))
        lines.append(f"| `{key}.{name}` | `{kind}` | `{field.default!r}` | {field.description or ''} |")
    return lines + [""]


def _config_table(key: str, config: type) -> list[str]:
    """A model's Config dataclass (models/<model>.py): its fields, defaults and `doc` metadata."""
    lines = [f"## `{key}`", "", inspect.cleandoc(config.__doc__ or ""), "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(config):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        lines.append(f"| `{key}.{field.name}` | `{field.type}` | `{default!r}` | {field.metadata.get('doc', '')} |")
    return lines + [""]


def write_generated_docs(root: Path) -> list[Path]:
    """Write docs/configuration.md and the stage blocks of the docs anew; returns the files written."""
    target = root / CONFIGURATION_DOCS
    target.parent.mkdir(exist_ok=True)
    target.write_text(configuration_markdown(root))
    return [target, *write_blocks(root)]
