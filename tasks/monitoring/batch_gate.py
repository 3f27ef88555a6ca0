"""The contract's gate for labelled batches (from `torchship ingest` or a retrain's production window): parse
by the committed contract and run its row-level rules; an accepted batch joins data/batches/ (prepare reads it),
a refused one goes to data/quarantine/ with its report."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tasks.contract import parse_with_contract
from tasks.core import paths
from tasks.core.artifacts import write_atomic
from tasks.core.contract_spec import ColumnRule, Contract
from tasks.core.errors import DataError
from tasks.core.expectations import validate_frames
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.problems import Problem
from tasks.core.quarantine import unique_stamp
from tasks.core.schema_spec import Schema
from tasks.core.tables import read_table


def contract_from_schema(schema: Schema) -> Contract:
    """Without a committed contract: the strict types of the current training data, nothing more."""
    columns = {f.name: ColumnRule(type=f.kind) for f in schema.features}
    columns[schema.target] = ColumnRule(type="categorical", nullable=False, max_null_share=0.0,
                                        categories=schema.classes)
    return Contract(target=schema.target, classes=schema.classes, columns=columns)


def judge_batch(path: Path, contract: Contract, params: Params) -> tuple[GateResult, pd.DataFrame | None]:
    try:
        raw, found = read_table(path)
    except DataError as exc:
        return _refused(exc), None
    return judge_rows(raw, str(path), contract, params, found)


def judge_rows(raw: pd.DataFrame, origin: str, contract: Contract, params: Params,
               found: list[Problem] = ()) -> tuple[GateResult, pd.DataFrame | None]:
    """Pure-ish core: parse by the contract and run its row-level rules (a batch may be small or skewed,
    so table-level row counts and class shares are judged when it joins the training set). Every problem
    is one reason of the refusal."""
    try:
        typed, _, dropped = parse_with_contract(raw, contract, origin, found)
    except DataError as exc:
        return _refused(exc), None
    batch_rules = contract.model_copy(update={"min_rows": 1, "max_rows": None, "min_class_share": 0.0})
    gate, _ = validate_frames({"batch": typed.reset_index(drop=True)}, None, params.validate_, contract=batch_rules)
    if dropped:
        gate = gate.model_copy(update={"reasons": gate.reasons + [f"ignored columns not in the contract: {dropped}"]})
    return gate, typed.drop(columns=dropped, errors="ignore")


def _refused(exc: DataError) -> GateResult:
    """A parse refusal as the gate: one reason per problem when the error lists them."""
    problems = getattr(exc, "problems", None)
    reasons = [f"{exc.origin}: {p.sentence()}" for p in problems] if problems else [str(exc)]
    return GateResult(gate="batch contract", status="fail", reasons=reasons)


def accept_batch(typed: pd.DataFrame, name: str) -> Path:
    """Store an accepted batch where prepare reads it (temp + rename: never half a batch)."""
    accepted = paths.BATCHES / f"{unique_stamp()}-{name}.parquet"
    write_atomic(accepted, lambda tmp: typed.to_parquet(tmp, index=False))
    return accepted
