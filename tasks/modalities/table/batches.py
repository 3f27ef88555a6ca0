"""The table's batch door, for labelled batches (from `torchship ingest` or a retrain's production window): parse
by the committed contract and run its row-level rules; an accepted batch joins data/batches/ (prepare reads it), a
refused one goes to data/quarantine/ with its report. A retrain's window is screened row by row first (a label that
is not a class, a missing feature, text in a number): refused rows are kept with the reason per row."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.errors import DataError
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.problems import Problem
from tasks.core.quarantine import quarantine_folder, quarantine_move, unique_stamp
from tasks.core.schema_spec import Schema
from tasks.core.servelog import LABEL
from tasks.modalities.interface import Labelled
from tasks.modalities.table.contract import ColumnRule, Contract
from tasks.modalities.table.expectations import validate_frames
from tasks.modalities.table.files import read_table
from tasks.modalities.table.parse import parse_with_contract

WINDOW_BATCH = "retrain-window"   # the name of a retrain window's batch (and its quarantine folders)


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


def labelled_rows(window, target: str, since: float, until: float) -> pd.DataFrame:
    """The window's feedback-labelled rows served in (since, until], as a table with the target column."""
    rows = window.labelled
    rows = rows[(rows["ts"] > since) & (rows["ts"] <= until)]
    table = rows[window.features].copy()
    table[target] = rows[LABEL].astype(str).values
    table.index = [f"served row {row_id}" for row_id in rows["id"]]
    return table


def screen_rows(table: pd.DataFrame, schema: Schema) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split rows the model could not learn from (a label that is not a class, a feature missing from the
    row, text in a numeric feature) from the rest; refused rows carry a `problem` column."""
    problems = pd.Series("", index=table.index)
    labels = table[schema.target]
    problems[~labels.isin(schema.classes)] += f"{schema.target}: not one of the classes {schema.classes}; "
    for feature in schema.features:
        if feature.name not in table:
            problems[:] += f"{feature.name}: missing; "
        elif feature.kind == "numeric":
            values = table[feature.name]
            bad = values.notna() & pd.to_numeric(values, errors="coerce").isna()
            problems[bad] += f"{feature.name}: not a number; "
    refused = problems != ""
    return table[~refused], table[refused].assign(problem=problems[refused].str.rstrip("; "))


def quarantine_rows(rows: pd.DataFrame, gate: GateResult, name: str) -> Path:
    folder = quarantine_folder(name)
    rows.to_csv(folder / "rows.csv")
    write_json_atomic(folder / "report.json", {**gate.model_dump(), "rows": len(rows)})
    return folder


def ingest_verdict(path: Path, params, schema: Schema) -> Labelled:
    """A batch file handed to `torchship ingest`: a refused one is moved to quarantine with its report."""
    gate, typed = judge_batch(path, params.contract or contract_from_schema(schema), params)
    if gate.blocks(params.validate_.warn_blocks) or typed is None:
        folder = quarantine_move(path)
        write_json_atomic(folder / "report.json", gate.model_dump())
        return Labelled(gate=gate.model_copy(update={"evidence": str(folder / "report.json")}), offered=0, accepted=0,
                        quarantined=0, store=None, quarantine=str(folder))
    return Labelled(gate=gate, offered=len(typed), accepted=len(typed), quarantined=0,
                    store=lambda: accept_batch(typed, path.stem))


def window_verdict(params, schema: Schema, window, since: float, until: float) -> Labelled:
    """The window's feedback-labelled rows served in (since, until], screened and judged; nothing joins the training
    set unless the gate passes, and nothing is lost (refused rows are kept in data/quarantine/)."""
    table = labelled_rows(window, schema.target, since, until)
    good, bad = screen_rows(table, schema)
    quarantine = None
    if len(bad):
        screen = GateResult(gate="retrain rows", status="fail",
                            reasons=[f"{len(bad)} row(s) refused; each row's reason is in rows.csv (problem)"])
        quarantine = str(quarantine_rows(bad, screen, f"{WINDOW_BATCH}-rows"))
    if good.empty:
        why = "no labelled row passed the screen" if len(table) else "no feedback-labelled rows in the window"
        gate = GateResult(gate="batch contract", status="fail", reasons=[why], evidence=quarantine)
        return Labelled(gate=gate, offered=len(table), accepted=0, quarantined=len(bad), store=None,
                        quarantine=quarantine)
    gate, typed = judge_rows(good, "the retrain window", params.contract or contract_from_schema(schema), params)
    if gate.blocks(params.validate_.warn_blocks) or typed is None:
        folder = quarantine_rows(good, gate, WINDOW_BATCH)
        return Labelled(gate=gate.model_copy(update={"evidence": str(folder / "report.json")}), offered=len(table),
                        accepted=0, quarantined=len(table), store=None, quarantine=str(folder))
    return Labelled(gate=gate, offered=len(table), accepted=len(typed), quarantined=len(bad),
                    store=lambda: accept_batch(typed.reset_index(drop=True), WINDOW_BATCH), quarantine=quarantine)
