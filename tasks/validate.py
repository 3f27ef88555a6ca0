"""validate: the Great Expectations gate on the prepared splits, with Data Docs as evidence.

DVC stage: `python -m tasks.validate`.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.schema_spec import load_schema
from tasks.modalities import modality_of
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


def run(params: Params) -> None:
    """DVC stage body: validate every split, write the report and Data Docs, enforce the gate."""
    from tasks.core.tracking import stage_run

    schema = load_schema(paths.SCHEMA)
    modality = modality_of(schema)
    gate, rows = modality.validate(params, schema)
    passed = sum(r["success"] for r in rows)
    write_json_atomic(paths.VALIDATE_REPORT, {**gate.model_dump(), "modality": schema.modality, "expectations": rows,
                                               "headline": f"{gate.status}: {passed}/{len(rows)} expectations"})
    with stage_run(params.tracking, "validate") as stage_log:
        stage_log.log_metrics({"expectations": len(rows), "expectations_passed": passed})
        stage_log.set_tags({"gate.status": gate.status})
        log_data_docs(stage_log, paths.DATA_DOCS)
    print_summary(rows, gate)
    log.info("%s gate: %s (Data Docs: %s)", gate.gate, gate.summary(), gate.evidence)
    if gate.blocks(params.validate_.warn_blocks):   # what was refused is kept (images: prepare kept each file)
        gate = modality.keep_refused(params, gate)
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
