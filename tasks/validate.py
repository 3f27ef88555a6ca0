"""validate: the Great Expectations gate on the prepared splits, with Data Docs as evidence.

DVC stage: `python -m tasks.validate`.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.expectations import validate_frames
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.quarantine import quarantine_copy
from tasks.core.schema_spec import load_schema
from tasks.core.sources import source_path
from tasks.modalities.image.contract import ImageContract
from tasks.modalities.image.expectations import rules_for, validate_splits
from tasks.modalities.image.shards import read_metadata
from tasks.stages.entry import stage_main

log = logging.getLogger("torchship.validate")

def report_markdown(report: dict) -> str:
    """The gate as a table (expectation, status, offending rows, sample) for the Prefect flow run."""
    lines = [f"# Data contract gate: {report['status']}", "", "; ".join(report["reasons"]), "",
             f"Data Docs: `{report.get('evidence')}`", "",
             "| split | expectation | column | status | offending rows | sample |", "|---|---|---|---|---|---|"]
    for row in sorted(report["expectations"], key=lambda r: r["success"]):
        lines.append(f"| {row['split']} | {row['expectation']} | {row['column'] or '(table)'} | "
                     f"{'pass' if row['success'] else 'FAIL'} | {row['unexpected_count']} | {row['sample']} |")
    return "\n".join(lines)


def print_summary(rows: list[dict], gate: GateResult) -> None:
    """Console summary: failing expectations first, then a count of the rest."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{gate.gate} gate: {gate.status}")
    for column in ("split", "expectation", "column", "offending rows", "sample"):
        table.add_column(column, overflow="fold")
    for row in [r for r in rows if not r["success"]]:
        table.add_row(row["split"], row["expectation"], str(row["column"] or "(table)"), str(row["unexpected_count"]),
                      ", ".join(row["sample"]))
    table.caption = f"{sum(r['success'] for r in rows)} of {len(rows)} expectations passed"
    Console(stderr=True).print(table)


def validate_images(params: Params, schema) -> tuple[GateResult, list[dict]]:
    """The image contract's suite on the written splits' metadata (tasks/modalities/image/expectations.py)."""
    splits = {name: read_metadata(path, schema.target) for name, path in
              (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT))}
    contract = params.contract if isinstance(params.contract, ImageContract) else None
    everything = pd.concat(splits.values(), ignore_index=True).assign(decodable=True)
    rules = rules_for(everything, params.images, contract)
    splits = {name: frame.assign(decodable=True, pixels=frame["width"] * frame["height"],
                                 aspect=frame[["width", "height"]].max(axis=1) / frame[["width", "height"]].min(axis=1))
              for name, frame in splits.items()}
    return validate_splits(splits, rules, params.validate_, docs_dir=paths.DATA_DOCS)


def validate_tables(params: Params, schema) -> tuple[GateResult, list[dict]]:
    """The data contract's suite (or, without one, the schema's) on the prepared splits."""
    frames = {"train": pd.read_parquet(paths.TRAIN_SPLIT), "val": pd.read_parquet(paths.VAL_SPLIT),
              "holdout": pd.read_parquet(paths.HOLDOUT_SPLIT)}
    if params.contract is not None:  # the contract judges the table as a whole (row count, key, class shares)
        frames = {"training data": pd.concat(frames.values(), ignore_index=True)}
    else:
        log.warning("no data contract in params.yaml: only strict types and parsing are enforced "
                    "(propose one with `torchship contract suggest DATA`)")
    return validate_frames(frames, schema, params.validate_, docs_dir=paths.DATA_DOCS, contract=params.contract)


def run(params: Params) -> None:
    """DVC stage body: validate every split, write the report and Data Docs, enforce the gate."""
    from tasks.core.tracking import stage_run

    schema = load_schema(paths.SCHEMA)
    gate, rows = (validate_images if schema.is_image else validate_tables)(params, schema)
    passed = sum(r["success"] for r in rows)
    write_json_atomic(paths.VALIDATE_REPORT, {**gate.model_dump(), "modality": schema.modality, "expectations": rows,
                                               "headline": f"{gate.status}: {passed}/{len(rows)} expectations"})
    with stage_run(params.tracking, "validate") as stage_log:
        stage_log.log_metrics({"expectations": len(rows), "expectations_passed": passed})
        stage_log.set_tags({"gate.status": gate.status})
        log_data_docs(stage_log, paths.DATA_DOCS)
    print_summary(rows, gate)
    log.info("%s gate: %s (Data Docs: %s)", gate.gate, gate.summary(), gate.evidence)
    if gate.blocks(params.validate_.warn_blocks) and not schema.is_image:   # images: prepare quarantined each file
        folder = quarantine_copy(source_path(params.data), gate.summary())
        if folder is not None:
            shutil.copy2(paths.VALIDATE_REPORT, folder / "report.json")
            gate = gate.model_copy(update={"reasons": gate.reasons + [f"the file and this report are in {folder}/"]})
    gate.enforce(params.validate_.warn_blocks)


def log_data_docs(stage_log, site: Path) -> None:
    """The Data Docs site as one archive (data_docs.zip: download and open its index.html) and its overview page
    (data_docs/index.html, shown by the MLflow UI). One upload per file of the site was about 100 requests: on a
    tracking server with basic auth, each checks the password hash (about 25 s a run on a busy 2-core box)."""
    with tempfile.TemporaryDirectory() as folder:
        archive = shutil.make_archive(str(Path(folder) / "data_docs"), "zip", root_dir=site)
        stage_log.log_artifact(archive)
    stage_log.log_artifact(str(site / "index.html"), artifact_path="data_docs")


if __name__ == "__main__":
    stage_main("validate", run)
