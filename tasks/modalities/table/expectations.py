"""The Great Expectations suite of the data contract, run on in-memory frames: one narrow batch per
column, pass/fail first, counts only for failing groups. Used by the validate stage and the ingest gate."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pandas as pd

from tasks.core import paths
from tasks.core.gate import GateResult
from tasks.core.params_spec import ValidateParams
from tasks.core.schema_spec import Schema
from tasks.modalities.table.contract import Contract

log = logging.getLogger("torchship.validate")
WARN = {"on_violation": "warn"}  # expectation meta: a violation warns instead of failing


def build_expectations(schema: Schema, rules: ValidateParams, split: str) -> list:
    """Without a contract: the suite derived from the schema (columns, types, nulls, labels, rows)."""
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
                                                         mostly=0.99, meta=WARN))
    return suite


def contract_expectations(contract: Contract) -> list:
    """With a contract: exactly what it declares, each with its own severity."""
    import great_expectations.expectations as gxe

    suite = [gxe.ExpectTableColumnsToMatchSet(column_set=list(contract.columns), exact_match=True),
             gxe.ExpectTableRowCountToBeBetween(min_value=contract.min_rows, max_value=contract.max_rows),
             gxe.ExpectColumnValuesToNotBeNull(column=contract.target),
             gxe.ExpectColumnValuesToBeInSet(column=contract.target, value_set=contract.classes)]
    if contract.key:
        suite.append(gxe.ExpectColumnValuesToBeUnique(column=contract.key))
    for name in contract.features:
        rule = contract.columns[name]
        meta = {"on_violation": rule.on_violation}
        nulls_allowed = rule.max_null_share if rule.nullable else 0.0
        suite.append(gxe.ExpectColumnValuesToNotBeNull(column=name, mostly=1 - nulls_allowed, meta=meta))
        if rule.type == "numeric" and (rule.min is not None or rule.max is not None):
            suite.append(gxe.ExpectColumnValuesToBeBetween(column=name, min_value=rule.min, max_value=rule.max,
                                                           meta=meta))
        if rule.type == "categorical" and rule.categories:
            suite.append(gxe.ExpectColumnValuesToBeInSet(column=name, value_set=rule.categories, meta=meta))
    return suite


def class_share_failures(target: pd.Series, contract: Contract) -> list[str]:
    """Each declared class must hold at least `min_class_share` of the rows."""
    shares = target.astype(str).value_counts(normalize=True)
    return [f"target '{contract.target}': class '{label}' holds {shares.get(label, 0.0):.3f} of {len(target)} rows "
            f"(rule: min_class_share {contract.min_class_share})"
            for label in contract.classes if shares.get(label, 0.0) < contract.min_class_share]


def validate_frames(frames: dict[str, pd.DataFrame], schema: Schema | None, rules: ValidateParams,
                    docs_dir: Path | None = None, contract: Contract | None = None) -> tuple[GateResult, list[dict]]:
    """Run the suite (the contract's, else the schema's) on each frame; return the gate result and one
    row per expectation."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.execution_engine import pandas_execution_engine

    # GX fingerprints every batch under HASH_THRESHOLD bytes (an md5 of all its rows) as a marker we never
    # read; on narrow per-column batches that hashing alone cost more than the checks.
    pandas_execution_engine.HASH_THRESHOLD = 0
    context = gx.get_context(mode="ephemeral")  # no YAML written per asset: the gate stays cheap
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name="torchship")
    rows, failures, warnings = [], [], []
    for split, frame in frames.items():
        expectations = contract_expectations(contract) if contract else build_expectations(schema, rules, split)
        for index, (column, group) in enumerate(_by_column(expectations).items()):
            # One narrow batch per column: GX filters its batch row-wise for every expectation, so a
            # one-column batch costs that column's bytes, not the whole table's.
            batch = frame[[column]] if column in frame.columns else frame  # a missing column: GX reports it
            results = _run_group(context, source, f"{split}-{index}", group, batch)
            for check in results:
                row = _result_row(split, check)
                rows.append(row)
                if not check.success:
                    message = (f"{split}: {row['expectation']} on '{row['column'] or 'table'}' "
                               f"({row['unexpected_count']} offending rows, e.g. {row['sample']})")
                    warn_only = (check.expectation_config.meta or {}).get("on_violation") == "warn"
                    (warnings if warn_only else failures).append(message)
        if contract is not None:
            failures += class_share_failures(frame[contract.target], contract)
    if docs_dir is not None:
        site = Path(context.build_data_docs()["local_site"].removeprefix("file://")).parent
        shutil.rmtree(docs_dir, ignore_errors=True)
        shutil.copytree(site, docs_dir)
    evidence = str(docs_dir / "index.html") if docs_dir is not None else None
    return GateResult.decide("data contract", failures, warnings, evidence=evidence,
                             passed=f"{len(rows)} expectations passed"), rows


def _by_column(expectations: list) -> dict[str | None, list]:
    """Table-level expectations under None (they read no rows), the rest by the column they read."""
    groups: dict[str | None, list] = {}
    for expectation in expectations:
        column = getattr(expectation, "column", None)
        groups.setdefault(column if isinstance(column, str) else None, []).append(expectation)
    return groups


def _run_group(context, source, name: str, expectations: list, frame: pd.DataFrame) -> list:
    """Pass/fail first (cheap); a group with a failure is re-run for counts and samples of bad values."""
    import great_expectations as gx

    batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("all")
    suite = context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
    result = definition.run(batch_parameters={"dataframe": frame}, result_format="BOOLEAN_ONLY")
    if not result.success:
        result = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
    return result.results


def _result_row(split: str, check) -> dict:
    config = check.expectation_config
    details = check.result or {}
    return {"split": split, "expectation": config.type, "column": config.kwargs.get("column"),
            "success": bool(check.success), "unexpected_count": details.get("unexpected_count", 0),
            "sample": [str(v) for v in (details.get("partial_unexpected_list") or [])[:3]]}


def validate_splits(params, schema) -> tuple[GateResult, list[dict]]:
    """The data contract's suite (or, without one, the schema's) on the prepared splits."""
    frames = {"train": pd.read_parquet(paths.TRAIN_SPLIT), "val": pd.read_parquet(paths.VAL_SPLIT),
              "holdout": pd.read_parquet(paths.HOLDOUT_SPLIT)}
    if params.contract is not None:  # the contract judges the table as a whole (row count, key, class shares)
        frames = {"training data": pd.concat(frames.values(), ignore_index=True)}
    else:
        log.warning("no data contract in params.yaml: only strict types and parsing are enforced "
                    "(propose one with `torchship contract suggest DATA`)")
    return validate_frames(frames, schema, params.validate_, docs_dir=paths.DATA_DOCS, contract=params.contract)
