"""The generated docs (`torchship config-docs`): docs/configuration.md from the typed configuration (every key, its
type, default and meaning; a step's own section too, from its module), and the pipeline's diagram and step table
from the stage list (tasks/stages/diagram.py), so the docs can never drift from the code (tests compare them)."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from pydantic import BaseModel

from tasks.config import declaring_steps, step_sections
from tasks.core.params_spec import Params
from tasks.stages.diagram import write_blocks

CONFIGURATION_DOCS = Path("docs") / "configuration.md"


def configuration_markdown(root: Path = Path(".")) -> str:
    """docs/configuration.md, generated from the typed model: every key, type, default, meaning (the steps' own
    sections: those of dvc.yaml under `root`, after the core's)."""
    from tasks.training.model_args import model_configs  # imports torch: only when the docs are built

    lines = ["# Configuration (`params.yaml`)", "",
             "Generated from `tasks/core/params_spec.py` (and a step's own section from its module, `PARAMS_SECTION` "
             "in `tasks/<step>.py`) by `torchship config-docs`; do not edit by hand.",
             "Override any key for one run with `torchship run --set section.key=value`.", ""]
    for section_name, section_field in Params.model_fields.items():
        section = section_field.annotation
        if section_name == "contract":
            lines += ["## `contract`", "", "Optional data contract (null = strict types and parse only): per table "
                      "`target`, `classes`, `min_class_share`, `min_rows`, `max_rows`, `key`; "
                      "per column under `columns:` `type` (numeric|categorical), `nullable`, `max_null_share`, "
                      "`min`, `max`, `categories`, "
                      "`on_violation` (fail|warn). Propose one with `torchship contract suggest DATA`.", ""]
            continue
        lines += _section_table(section_field.alias or section_name, section)
        if section_name == "train":
            for model, config in model_configs().items():
                lines += _config_table(f"train.model_args.{model}", config)
    for name, spec in step_sections(declaring_steps(root)).items():
        lines += _section_table(name, spec)
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
