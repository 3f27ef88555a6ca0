"""retrain: turn the labelled production window into a training batch. Rows with feedback labels (newer than
what an earlier retrain used) are screened row by row (bad rows to quarantine with a report), the rest are
judged at the contract's batch gate, stored under data/batches/ and snapshotted by DVC (`dvc add`; on the team
topology into the shared batch index, under the model's registry lock), so dvc.lock and the new version's lineage
name the data the retrain saw. The flow then re-runs the pipeline: the normal gates bless or reject the result
and the canary decides; a retrain never promotes by itself."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from pydantic import BaseModel

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.quarantine import quarantine_folder
from tasks.core.schema_spec import Schema, load_schema
from tasks.monitoring import batch_index
from tasks.monitoring.batch_gate import accept_batch, contract_from_schema, judge_rows
from tasks.monitoring.window import LABEL, Window

log = logging.getLogger("torchship.retrain")
BATCH_NAME = "retrain-window"


class RetrainBatch(BaseModel):
    gate: GateResult
    rows: int                        # labelled rows the window offered
    accepted_rows: int
    quarantined_rows: int
    batch: str | None = None         # the accepted file under data/batches/
    quarantine: str | None = None    # where refused rows went, with report.json
    labels_since: float
    labels_until: float


def labelled_rows(window: Window, target: str, since: float, until: float) -> pd.DataFrame:
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


def take_window(params: Params, window: Window, since: float, until: float) -> RetrainBatch:
    """The core: screen, judge and store the labelled window; nothing joins the training set unless the gate
    passes, and nothing is lost (refused rows are kept in data/quarantine/ with the reason per row)."""
    schema = load_schema(paths.SCHEMA)
    table = labelled_rows(window, schema.target, since, until)
    good, bad = screen_rows(table, schema)
    common = dict(rows=len(table), labels_since=since, labels_until=until)
    quarantine = None
    if len(bad):
        screen = GateResult(gate="retrain rows", status="fail",
                            reasons=[f"{len(bad)} row(s) refused; each row's reason is in rows.csv (problem)"])
        quarantine = str(quarantine_rows(bad, screen, f"{BATCH_NAME}-rows"))
    if good.empty:
        why = "no labelled row passed the screen" if len(table) else "no feedback-labelled rows in the window"
        gate = GateResult(gate="batch contract", status="fail", reasons=[why], evidence=quarantine)
        return RetrainBatch(gate=gate, accepted_rows=0, quarantined_rows=len(bad), quarantine=quarantine, **common)
    gate, typed = judge_rows(good, "the retrain window", params.contract or contract_from_schema(schema), params)
    if gate.blocks(params.validate_.warn_blocks) or typed is None:
        folder = quarantine_rows(good, gate, BATCH_NAME)
        return RetrainBatch(gate=gate.model_copy(update={"evidence": str(folder / "report.json")}), accepted_rows=0,
                            quarantined_rows=len(table), quarantine=str(folder), **common)
    accepted = keep_batch(params, lambda: accept_batch(typed.reset_index(drop=True), BATCH_NAME))
    log.info("retrain: %d labelled rows accepted into %s (%d quarantined)", len(typed), accepted, len(bad))
    return RetrainBatch(gate=gate, accepted_rows=len(typed), quarantined_rows=len(bad), batch=str(accepted),
                        quarantine=quarantine, **common)


def ingested_image_times() -> list[float] | None:
    """An image model's labelled examples for a retrain: when each image `torchship ingest` accepted arrived (None
    for a table model, whose retrain learns from the window's feedback labels)."""
    if not paths.SCHEMA.exists() or not load_schema(paths.SCHEMA).is_image:
        return None
    from tasks.modalities.image.batches import SUFFIX, accepted_at

    times = []
    for path in sorted(paths.BATCHES.glob(f"*{SUFFIX}")):
        times += [accepted_at(path)] * len(pd.read_parquet(path, columns=["name"]))
    return times


def take_ingested(params: Params, since: float, until: float) -> RetrainBatch:
    """An image model's retrain batch: the images `torchship ingest` accepted in (since, until] (already judged
    at the image batch door, in data/batches/), snapshotted by DVC like a table's window."""
    from tasks.modalities.image.batches import SUFFIX, accepted_at

    batches = [p for p in sorted(paths.BATCHES.glob(f"*{SUFFIX}")) if since < accepted_at(p) <= until]
    images = sum(len(pd.read_parquet(p, columns=["name"])) for p in batches)
    common = dict(rows=images, labels_since=since, labels_until=until, quarantined_rows=0)
    if not batches:
        gate = GateResult(gate="image batch", status="fail", reasons=[
            "no labelled images were ingested since the last retrain: an image model learns from the images "
            "`torchship ingest DIR` accepts (the request log keeps no pixels)"])
        return RetrainBatch(gate=gate, accepted_rows=0, **common)
    kept = keep_batch(params, lambda: batches[-1])   # snapshots data/batches/: the version's lineage names them
    gate = GateResult(gate="image batch", status="pass",
                      reasons=[f"{images} labelled images in {len(batches)} ingested batch(es)"])
    return RetrainBatch(gate=gate, accepted_rows=images, batch=str(kept), **common)


def take_labelled(params: Params, window: Window, since: float, until: float) -> RetrainBatch:
    """What a retrain learns from: the window's feedback-labelled rows (tables), or the ingested images (images)."""
    if load_schema(paths.SCHEMA).is_image:
        return take_ingested(params, since, until)
    return take_window(params, window, since, until)


def keep_batch(params: Params, store: Callable[[], Path]) -> Path:
    """Store the accepted batch and snapshot data/batches/ with DVC, so dvc.lock and the version's lineage name it;
    on the team topology into the shared batch index (tasks/monitoring/batch_index.py)."""
    return batch_index.keep_batch(params.tracking, params.data.registered_model_name(), store)
