"""prepare for tables: load the source, parse it strictly (by the contract when there is one), split it stratified,
fit the schema on the training split, write the splits and the schema. A file the parse refuses is copied to
data/quarantine/ with every problem found."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pandas as pd
from sklearn.model_selection import train_test_split

from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.errors import DataError
from tasks.core.labels import class_labels, label_strings
from tasks.core.params_spec import MAX_NON_NUMERIC_SHARE, PrepareParams
from tasks.core.problems import Problem
from tasks.core.quarantine import quarantine_copy
from tasks.core.schema_spec import Schema
from tasks.modalities.table.contract import Contract
from tasks.modalities.table.parse import build_schema, parse_table, parse_with_contract
from tasks.modalities.table.sources import read_source, source_path

log = logging.getLogger("torchship.prepare")


@dataclass(frozen=True)
class PreparedData:
    train: pd.DataFrame
    val: pd.DataFrame
    holdout: pd.DataFrame
    schema: Schema


def prepare_tables(raw: pd.DataFrame, target: str, origin: str, params: PrepareParams,
                   contract: Contract | None = None, found: list[Problem] = (),
                   max_non_numeric_share: float = MAX_NON_NUMERIC_SHARE) -> PreparedData:
    """Pure core: strict parse (by the contract when there is one), stratified three-way split, schema
    fitted on the training split. Every problem of the table (with those `found` while reading it) is reported
    in one refusal."""
    if contract is None:
        typed, kinds = parse_table(raw, target, origin, max_non_numeric_share, found)
    else:
        typed, kinds, dropped = parse_with_contract(raw, contract, origin, found)
        if dropped:
            log.warning("%s: column(s) %s are not in the contract and are not used", origin, dropped)
    typed[target] = label_strings(typed[target])
    classes = class_labels(typed[target])
    smallest = typed[target].value_counts().min()
    if smallest < 3:
        raise DataError(f"{origin}: a class of '{target}' has only {smallest} row(s); each class needs at least 3 "
                        "to appear in train, validation and holdout. Add rows or merge rare classes.")
    typed = typed.reset_index(drop=True)
    try:
        rest, holdout = train_test_split(typed, test_size=params.holdout_fraction, random_state=params.seed,
                                         stratify=typed[target])
        val_share = params.val_fraction / (1 - params.holdout_fraction)
        train, val = train_test_split(rest, test_size=val_share, random_state=params.seed, stratify=rest[target])
    except ValueError as exc:  # too few rows for a stratified split with this many classes
        raise DataError(f"{origin}: {len(typed)} rows are too few to split {len(classes)} classes into train, "
                        f"validation and holdout ({exc}). Add rows, or raise prepare.val_fraction / "
                        "prepare.holdout_fraction.") from None
    schema = build_schema(train, kinds, target, classes, origin, params.max_categories, contract)
    return PreparedData(train.reset_index(drop=True), val.reset_index(drop=True),
                        holdout.reset_index(drop=True), schema)


def write_prepared(prepared: PreparedData) -> dict:
    """Write the splits, schema and headline figures atomically."""
    for frame, path in ((prepared.train, paths.TRAIN_SPLIT), (prepared.val, paths.VAL_SPLIT),
                        (prepared.holdout, paths.HOLDOUT_SPLIT)):
        write_atomic(path, lambda tmp, frame=frame: frame.to_parquet(tmp, index=False))
    write_atomic(paths.SCHEMA, lambda tmp: tmp.write_text(prepared.schema.to_json()))
    target = prepared.schema.target
    metrics = {
        "rows": {"train": len(prepared.train), "val": len(prepared.val), "holdout": len(prepared.holdout)},
        "features": {"numeric": sum(f.kind == "numeric" for f in prepared.schema.features),
                     "categorical": sum(f.kind == "categorical" for f in prepared.schema.features)},
        "classes": len(prepared.schema.classes),
        "class_share": {str(k): round(float(v), 4) for k, v in
                        prepared.train[target].value_counts(normalize=True).sort_index().items()},
        "headline": f"{len(prepared.train) + len(prepared.val) + len(prepared.holdout):,} rows, "
                    f"{len(prepared.schema.features)} features, {len(prepared.schema.classes)} classes",
    }
    write_json_atomic(paths.PREPARE_METRICS, metrics)
    return metrics


def prepare_source(params, target: str) -> dict:
    """The stage's table body: read, parse, split, write; a refused file is quarantined with the reason."""
    try:
        raw, origin, found = read_source(params.data)
        prepared = prepare_tables(raw, target, origin, params.prepare, params.contract, found,
                                  params.validate_.max_non_numeric_share)
    except DataError as exc:
        folder = quarantine_copy(source_path(params.data), str(exc), getattr(exc, "report", lambda: None)())
        if folder:
            raise DataError(f"{exc} (a copy of the file and this reason are in {folder}/)") from None
        raise
    return write_prepared(prepared)


def keep_refused_source(params, gate):
    """After a blocking validation: a copy of the source file and the gate's report in data/quarantine/, named in
    the gate's reasons."""
    import shutil

    folder = quarantine_copy(source_path(params.data), gate.summary())
    if folder is None:
        return gate
    shutil.copy2(paths.VALIDATE_REPORT, folder / "report.json")
    return gate.model_copy(update={"reasons": gate.reasons + [f"the file and this report are in {folder}/"]})
