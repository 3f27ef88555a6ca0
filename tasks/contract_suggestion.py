"""`torchship contract suggest`: profile reference data and write a suggested `contract:` section (YAML)
for a human to review and commit."""
from __future__ import annotations

import io

from tasks.contract import parse_table
from tasks.core.contract_spec import Contract, suggest_contract
from tasks.core.params_spec import DataParams
from tasks.core.sources import load_source, resolve_target


def contract_yaml(contract: Contract, origin: str, rows: int) -> str:
    """The `contract:` section as YAML, headed by where it came from."""
    from ruamel.yaml import YAML

    buffer = io.StringIO()
    yaml = YAML()
    yaml.width = 120
    yaml.dump({"contract": contract.model_dump(exclude_none=True)}, buffer)
    return (f"# Proposed from {origin} ({rows} rows) by `torchship contract suggest`: review every rule.\n"
            + buffer.getvalue())


def suggested_contract(current: DataParams, source: str, target: str | None, margin: float) -> str:
    """Read `source` (a file, `synthetic` or `sklearn:<name>`; target defaults to the configured one), type it
    strictly, and propose a contract from what it holds (ranges widened by `margin`)."""
    data = DataParams(**{**current.model_dump(), "source": source, "target": target or current.target})
    label = resolve_target(data)
    raw, origin = load_source(data, with_batches=False)  # reference data: what the user brought, nothing else
    typed, kinds = parse_table(raw, label, origin)
    return contract_yaml(suggest_contract(typed, kinds, label, margin=margin), origin, len(typed))
