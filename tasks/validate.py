"""validate: the Great Expectations gate on the prepared splits, with Data Docs as evidence.

DVC stage: `python -m tasks.validate`.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from tasks import layout
from tasks.artifacts import write_json_atomic
from tasks.config import Params, ValidateParams
from tasks.contract import Schema, load_schema
from tasks.gate import GateResult

log = logging.getLogger("torchship.validate")

# Expectations whose violation only warns (the rest fail the gate).
WARN_ONLY = {"expect_column_values_to_be_in_set"}


def build_expectations(schema: Schema, rules: ValidateParams, split: str) -> list:
    """The suite derived from the schema: columns, types, nulls, categories, labels, row count."""
    import great_expectations.expectations as gxe

    columns = schema.feature_names + [schema.target]
    suite = [gxe.ExpectTableColumnsToMatchSet(column_set=columns, exact_match=True),
             gxe.ExpectTableRowCountToBeBetween(min_value=rules.min_rows if split == "train" else 1),
             gxe.ExpectColumnValuesToNotBeNull(column=schema.target),
             gxe.ExpectColumnValuesToBeInSet(column=schema.target, value_set=schema.classes)]
    for feature in schema.features:
        suite.append(gxe.ExpectColumnValuesToNotBeNull(column=feature.name, mostly=1 - rules.max_null_share))
        if feature.kind == "numeric":
            suite.append(gxe.ExpectColumnValuesToBeInTypeList(column=feature.name, type_list=["float64", "float32"]))
        elif feature.categories:
            # Unseen categories map to "unknown": worth a warning on held-out splits, never silent.
            suite.append(gxe.ExpectColumnValuesToBeInSet(column=feature.name, value_set=feature.categories,
                                                         mostly=0.99))
    return suite


def validate_frames(frames: dict[str, pd.DataFrame], schema: Schema, rules: ValidateParams,
                    docs_dir: Path | None = None) -> tuple[GateResult, list[dict]]:
    """Run the suite on each split; return the gate result and one row per expectation."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    with tempfile.TemporaryDirectory() as root:
        context = gx.get_context(mode="file", project_root_dir=root)
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = context.data_sources.add_pandas(name="torchship")
        rows, failures, warnings = [], [], []
        for split, frame in frames.items():
            batch = source.add_dataframe_asset(name=split).add_batch_definition_whole_dataframe("all")
            suite = context.suites.add(gx.ExpectationSuite(name=f"{split}_contract",
                                                           expectations=build_expectations(schema, rules, split)))
            definition = context.validation_definitions.add(gx.ValidationDefinition(name=split, data=batch, suite=suite))
            checkpoint = context.checkpoints.add(gx.Checkpoint(
                name=f"{split}_gate", validation_definitions=[definition],
                actions=[gx.checkpoint.UpdateDataDocsAction(name="docs")], result_format={"result_format": "SUMMARY"}))
            result = checkpoint.run(batch_parameters={"dataframe": frame})
            for validation in result.run_results.values():
                for check in validation.results:
                    row = _result_row(split, check)
                    rows.append(row)
                    if not check.success:
                        message = (f"{split}: {row['expectation']} on '{row['column'] or 'table'}' "
                                   f"({row['unexpected_count']} offending rows, e.g. {row['sample']})")
                        warn_only = row["expectation"] in WARN_ONLY and row["column"] != schema.target
                        (warnings if warn_only else failures).append(message)
        if docs_dir is not None:
            context.build_data_docs()
            site = Path(root) / "gx" / "uncommitted" / "data_docs" / "local_site"
            shutil.rmtree(docs_dir, ignore_errors=True)
            shutil.copytree(site, docs_dir)
    evidence = str(docs_dir / "index.html") if docs_dir is not None else None
    return GateResult.decide("data contract", failures, warnings, evidence=evidence,
                             passed=f"{len(rows)} expectations passed"), rows


def _result_row(split: str, check) -> dict:
    config = check.expectation_config
    details = check.result or {}
    return {"split": split, "expectation": config.type, "column": config.kwargs.get("column"),
            "success": bool(check.success), "unexpected_count": details.get("unexpected_count", 0),
            "sample": [str(v) for v in (details.get("partial_unexpected_list") or [])[:3]]}


def run(params: Params) -> None:
    """DVC stage body: validate every split, write the report and Data Docs, enforce the gate."""
    import mlflow

    from tasks.tracking import stage_run

    schema = load_schema(layout.SCHEMA)
    frames = {"train": pd.read_parquet(layout.TRAIN_SPLIT), "val": pd.read_parquet(layout.VAL_SPLIT),
              "holdout": pd.read_parquet(layout.HOLDOUT_SPLIT)}
    gate, rows = validate_frames(frames, schema, params.validate_, docs_dir=layout.DATA_DOCS)
    passed = sum(r["success"] for r in rows)
    write_json_atomic(layout.VALIDATE_REPORT, {**gate.model_dump(), "expectations": rows,
                                               "headline": f"{gate.status}: {passed}/{len(rows)} expectations"})
    with stage_run(params.tracking, "validate"):
        mlflow.log_metrics({"expectations": len(rows), "expectations_passed": passed})
        mlflow.set_tag("gate.status", gate.status)
        mlflow.log_artifacts(str(layout.DATA_DOCS), artifact_path="data_docs")
    log.info("data contract gate: %s (Data Docs: %s)", gate.summary(), gate.evidence)
    gate.enforce(params.validate_.warn_blocks)


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("validate", run)
