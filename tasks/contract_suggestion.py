"""`torchship contract suggest`: profile reference data (by its modality: a table, images, texts) and write a
proposed `contract:` section (YAML) for a human to review and commit."""
from __future__ import annotations

import io

from tasks.modalities import detect_modality
from tasks.modalities.interface import Suggestion
from tasks.modalities.sources import resolve_target


def contract_yaml(suggestion: Suggestion) -> str:
    """The `contract:` section as YAML, headed by where it came from and what was left out."""
    from ruamel.yaml import YAML

    buffer = io.StringIO()
    yaml = YAML()
    yaml.width = 120
    yaml.dump({"contract": suggestion.contract.model_dump(exclude_none=True)}, buffer)
    notes = "".join(f"# {note}\n" for note in suggestion.notes)
    return (notes + f"# Proposed from {suggestion.origin} ({suggestion.items} {suggestion.unit}) by `torchship "
            "contract suggest`: review every rule.\n" + buffer.getvalue())


def suggested_contract(params, source: str, target: str | None, margin: float) -> str:
    """Read `source` (a file, a folder, or a built-in source; the label column defaults to the configured one) by its
    modality, and propose a contract from what it holds (ranges widened by `margin`)."""
    data = params.data.model_copy(update={"source": source, "target": target or params.data.target})
    scoped = params.model_copy(update={"data": data, "contract": None})
    return contract_yaml(detect_modality(data, scoped).suggest_contract(scoped, resolve_target(scoped), margin))
