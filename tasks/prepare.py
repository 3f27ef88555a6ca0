"""prepare: load the source, parse it strictly, split it stratified, fit the schema on train.

DVC stage: `python -m tasks.prepare`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pandas as pd
from sklearn.model_selection import train_test_split

from tasks.contract import build_schema, parse_table, parse_with_contract
from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.contract_spec import Contract, class_labels, label_strings
from tasks.core.errors import DataError
from tasks.core.params_spec import MAX_NON_NUMERIC_SHARE, Params, PrepareParams
from tasks.core.problems import Problem
from tasks.core.quarantine import quarantine_copy
from tasks.core.schema_spec import Schema
from tasks.core.sources import is_image_data, read_source, resolve_target, source_path
from tasks.modalities.image.batches import batch_files
from tasks.modalities.image.contract import ImageContract
from tasks.modalities.image.prepare import PreparedImages, prepare_images
from tasks.modalities.image.shards import ROW_GROUP, write_split
from tasks.modalities.image.sources import list_images
from tasks.stages.entry import stage_main

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


def write_prepared_images(prepared: PreparedImages) -> dict:
    """Write the image splits (one shard file each), the schema and the headline figures atomically."""
    shape = prepared.schema.image.shape
    for name, path in (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT)):
        frame, pixels = prepared.splits[name], prepared.pixels[name]
        batches = ((pixels[i:i + ROW_GROUP], frame.iloc[i:i + ROW_GROUP]) for i in range(0, len(frame), ROW_GROUP))
        write_split(path, batches, prepared.schema.target, shape)
    write_atomic(paths.SCHEMA, lambda tmp: tmp.write_text(prepared.schema.to_json()))
    train = prepared.splits["train"][prepared.schema.target]
    rows = {name: len(frame) for name, frame in prepared.splits.items()}
    image = prepared.schema.image
    metrics = {"modality": "image", "rows": rows, "images": prepared.images, "refused": len(prepared.refused),
               "size": [image.height, image.width], "mode": image.mode, "classes": len(prepared.schema.classes),
               "class_share": {str(k): round(float(v), 4) for k, v in
                               train.value_counts(normalize=True).sort_index().items()},
               "headline": f"{sum(rows.values()):,} images {image.height}x{image.width} {image.mode}, "
                           f"{len(prepared.schema.classes)} classes"
                           + (f", {len(prepared.refused)} refused (quarantined)" if prepared.refused else "")}
    write_json_atomic(paths.PREPARE_METRICS, metrics)
    return metrics


def run_images(params: Params, target: str) -> dict:
    """The image source: list, judge, quarantine, split, size, write (tasks/modalities/image/prepare.py)."""
    files, origin = list_images(params.data.source, target, params.images.path_column, params.images.rendered,
                                params.data.seed, params.data.drift)
    accepted = batch_files()   # labelled images `torchship ingest` accepted
    if accepted:
        files, origin = files + accepted, f"{origin} + {len(accepted)} accepted batch image(s)"
    contract = params.contract if isinstance(params.contract, ImageContract) else None
    return write_prepared_images(prepare_images(files, origin, target, params.images, params.prepare, contract))


def run(params: Params) -> None:
    """DVC stage body: load, prepare, write, log."""
    from tasks.core.tracking import stage_run

    target = resolve_target(params.data, params.contract, params.images)
    if is_image_data(params.data, params.images):
        metrics = run_images(params, target)
        with stage_run(params.tracking, "prepare") as stage_log:
            stage_log.log_params({"source": params.data.source, "target": target, "modality": "image",
                                  **params.prepare.model_dump()})
            stage_log.log_metrics({"rows_train": metrics["rows"]["train"], "classes": metrics["classes"],
                                   "images_refused": metrics["refused"]})
            stage_log.log_artifact(str(paths.SCHEMA))
        log.info("prepared %s", metrics["headline"])
        return
    try:
        raw, origin, found = read_source(params.data)
        prepared = prepare_tables(raw, target, origin, params.prepare, params.contract, found,
                                  params.validate_.max_non_numeric_share)
    except DataError as exc:
        folder = quarantine_copy(source_path(params.data), str(exc), getattr(exc, "report", lambda: None)())
        if folder:
            raise DataError(f"{exc} (a copy of the file and this reason are in {folder}/)") from None
        raise
    metrics = write_prepared(prepared)
    with stage_run(params.tracking, "prepare") as stage_log:
        stage_log.log_params({"source": params.data.source, "target": target, **params.prepare.model_dump()})
        stage_log.log_metrics({"rows_train": metrics["rows"]["train"], "classes": metrics["classes"]})
        stage_log.log_artifact(str(paths.SCHEMA))
    log.info("prepared %s", metrics["headline"])


if __name__ == "__main__":
    stage_main("prepare", run)
