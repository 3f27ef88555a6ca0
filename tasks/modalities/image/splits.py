"""The prepared image splits on disk: one shard file per split (tasks/modalities/image/shards.py), the schema and
prepare's metrics, written atomically."""
from __future__ import annotations

import pandas as pd

from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.gate import GateResult
from tasks.modalities.image.batches import batch_files
from tasks.modalities.image.contract import ImageContract, image_shape
from tasks.modalities.image.expectations import rules_for, validate_splits
from tasks.modalities.image.prepare import PreparedImages, prepare_images
from tasks.modalities.image.shards import ROW_GROUP, read_metadata, write_split
from tasks.modalities.image.sources import list_images


def write_prepared_images(prepared: PreparedImages) -> dict:
    """Write the image splits (one shard file each), the schema and the headline figures atomically."""
    shape = image_shape(prepared.schema).shape
    for name, path in (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT)):
        frame, pixels = prepared.splits[name], prepared.pixels[name]
        batches = ((pixels[i:i + ROW_GROUP], frame.iloc[i:i + ROW_GROUP]) for i in range(0, len(frame), ROW_GROUP))
        write_split(path, batches, prepared.schema.target, shape)
    write_atomic(paths.SCHEMA, lambda tmp: tmp.write_text(prepared.schema.to_json()))
    train = prepared.splits["train"][prepared.schema.target]
    rows = {name: len(frame) for name, frame in prepared.splits.items()}
    image = image_shape(prepared.schema)
    metrics = {"modality": "image", "rows": rows, "images": prepared.images, "refused": len(prepared.refused),
               "size": [image.height, image.width], "mode": image.mode, "classes": len(prepared.schema.classes),
               "class_share": {str(k): round(float(v), 4) for k, v in
                               train.value_counts(normalize=True).sort_index().items()},
               "headline": f"{sum(rows.values()):,} images {image.height}x{image.width} {image.mode}, "
                           f"{len(prepared.schema.classes)} classes"
                           + (f", {len(prepared.refused)} refused (quarantined)" if prepared.refused else "")}
    write_json_atomic(paths.PREPARE_METRICS, metrics)
    return metrics


def prepare_source(params, target: str) -> dict:
    """The stage's image body: list, judge, quarantine, split, size, write (tasks/modalities/image/prepare.py)."""
    files, origin = list_images(params.data.source, target, params.images.path_column, params.images.rendered,
                                params.data.seed, params.data.drift)
    accepted = batch_files()   # labelled images `torchship ingest` accepted
    if accepted:
        files, origin = files + accepted, f"{origin} + {len(accepted)} accepted batch image(s)"
    contract = params.contract if isinstance(params.contract, ImageContract) else None
    return write_prepared_images(prepare_images(files, origin, target, params.images, params.prepare, contract))


def validate_prepared(params, schema) -> tuple[GateResult, list[dict]]:
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
