"""ingest: the door for new labelled batches (production data for retraining). A batch is judged by the
committed contract before it joins the training set; a failing batch is moved to quarantine with its report
and the training set stays as it was. Accepted batches are read by `prepare` after the source."""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from tasks.config import Params
from tasks.contract import Schema, load_schema, parse_with_contract, read_raw_table
from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.contract_spec import ColumnRule, Contract
from tasks.core.errors import DataError
from tasks.core.expectations import validate_frames
from tasks.core.gate import GateResult
from tasks.core.quarantine import quarantine_move, unique_stamp

log = logging.getLogger("torchship.ingest")


def contract_from_schema(schema: Schema) -> Contract:
    """Without a committed contract: the strict types of the current training data, nothing more."""
    columns = {f.name: ColumnRule(type=f.kind) for f in schema.features}
    columns[schema.target] = ColumnRule(type="categorical", nullable=False, max_null_share=0.0,
                                        categories=schema.classes)
    return Contract(target=schema.target, classes=schema.classes, columns=columns)


def judge_batch(path: Path, contract: Contract, params: Params) -> tuple[GateResult, pd.DataFrame | None]:
    """Pure-ish core: parse by the contract and run its row-level rules (a batch may be small or skewed,
    so table-level row counts and class shares are judged when it joins the training set)."""
    try:
        typed, _, dropped = parse_with_contract(read_raw_table(path), contract, str(path))
    except DataError as exc:
        return GateResult(gate="batch contract", status="fail", reasons=[str(exc)]), None
    batch_rules = contract.model_copy(update={"min_rows": 1, "max_rows": None, "min_class_share": 0.0})
    gate, _ = validate_frames({"batch": typed.reset_index(drop=True)}, None, params.validate_, contract=batch_rules)
    if dropped:
        gate = gate.model_copy(update={"reasons": gate.reasons + [f"ignored columns not in the contract: {dropped}"]})
    return gate, typed.drop(columns=dropped, errors="ignore")


def ingest_batch(path: Path, params: Params) -> tuple[GateResult, Path]:
    """Accept the batch into data/batches/, or move it to data/quarantine/ with its report."""
    contract = params.contract or contract_from_schema(load_schema(paths.SCHEMA))
    gate, typed = judge_batch(path, contract, params)
    if gate.blocks(params.validate_.warn_blocks) or typed is None:
        folder = quarantine_move(path)
        write_json_atomic(folder / "report.json", gate.model_dump())
        return gate.model_copy(update={"evidence": str(folder / "report.json")}), folder
    accepted = paths.BATCHES / f"{unique_stamp()}-{path.stem}.parquet"
    write_atomic(accepted, lambda tmp: typed.to_parquet(tmp, index=False))
    return gate, accepted

