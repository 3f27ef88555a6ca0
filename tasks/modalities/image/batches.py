"""Labelled image batches: the door new images pass before they join the training set (`torchship ingest DIR`), and
what prepare and a retrain read of them.

The request log keeps no pixels, so an image model's retrain learns from the labelled images a person ingests
(a folder with one subfolder per class, or a manifest): each image is judged by the same per-image rules as the
source's (GX on the metadata table, with the trained set's classes and mode), refused ones are quarantined with the
report, and the rest are stored as one Parquet file of their original bytes and labels under data/batches/
(`<time>-<name>.images.parquet`): prepare decodes them as it decodes the source's files."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from tasks.core import paths
from tasks.core.artifacts import write_atomic
from tasks.core.gate import GateResult
from tasks.core.quarantine import safe_name, unique_stamp
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageContract, image_shape
from tasks.modalities.image.decode import ImageLimits
from tasks.modalities.image.expectations import judge_images, metadata_table, rules_for
from tasks.modalities.image.prepare import inspect_file
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image.sources import ImageFile, path_refusals

SUFFIX = ".images.parquet"
STAMP = "%Y%m%d-%H%M%S"   # tasks/core/quarantine.py unique_stamp's time part


def judge_image_batch(files: list[ImageFile], origin: str, schema: Schema, params: ImagesParams,
                      contract: ImageContract | None) -> tuple[GateResult, list[ImageFile], dict[str, list[str]]]:
    """(the gate, the accepted files, refused name -> rules) of a labelled image batch: the source's per-image rules
    with the trained set's classes and mode; it fails when the refused share is over max_bad_share."""
    limits = ImageLimits(max_file_bytes=contract.max_file_bytes if contract else int(params.max_file_mb * (1 << 20)),
                         max_pixels=params.max_pixels)
    records, judged = [], {}
    for file in files:   # each read once, within the size limit: what is judged is what is stored
        record, judged[file.name] = inspect_file(file, limits)
        record.pixels = None   # not needed here: a batch's decoded pixels are not held
        records.append(record)
    table = metadata_table([r.row() for r in records])
    rules = rules_for(table, params, contract)
    rules = type(rules)(**{**rules.__dict__, "classes": list(schema.classes), "mode": image_shape(schema).mode})
    refused = {**judge_images(table, rules).refused, **path_refusals(files)}
    held = prepared_hashes()
    for name, digest in zip(table["name"], table["sha256"]):   # a batch image the splits hold would leak
        if digest in held:
            refused.setdefault(name, []).append(f"not already in the prepared splits: its content is in {held[digest]}")
    if not files:
        return GateResult(gate="image batch", status="fail", reasons=[f"{origin} holds no images"]), [], {}
    share = len(refused) / len(files)
    reasons = [f"{name}: {'; '.join(broken)}" for name, broken in sorted(refused.items())]
    if share > rules.max_bad_share or len(refused) == len(files):
        gate = GateResult.decide("image batch", [f"{len(refused)} of {len(files)} images refused ({share:.1%}), over "
                                                 f"max_bad_share {rules.max_bad_share:.0%}", *reasons])
    else:   # within the share: the refused ones are named (a warning), the rest join
        gate = GateResult.decide("image batch", [], reasons,
                                 passed=f"{len(files)} of {len(files)} images accepted")
    accepted = [ImageFile(name=f.name, label=f.label, read=lambda limit=None, data=judged[f.name]: data)
                for f in files if f.name not in refused]
    return gate, accepted, refused


def prepared_hashes() -> dict[str, str]:
    """sha256 -> split of every prepared image (what a batch image must not repeat)."""
    from tasks.modalities.image.shards import read_metadata

    held = {}
    for split, path in (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT)):
        if path.exists():
            held.update(dict.fromkeys(read_metadata(path, "label")["sha256"], split))
    return held


def write_image_batch(files: list[ImageFile], name: str) -> Path:
    """The accepted images (original bytes and labels) as one file under data/batches/ (temp + rename)."""
    frame = pd.DataFrame({"name": [f.name for f in files], "label": [f.label for f in files],
                          "data": [f.read() for f in files]})
    accepted = paths.BATCHES / f"{unique_stamp()}-{safe_name(name)}{SUFFIX}"
    write_atomic(accepted, lambda tmp: frame.to_parquet(tmp, index=False))
    return accepted


def batch_files(since: float = 0.0) -> list[ImageFile]:
    """Every image of the accepted batches (those accepted after `since`, unix seconds), named `<batch>/<name>`."""
    found = []
    for path in sorted(paths.BATCHES.glob(f"*{SUFFIX}")):
        if accepted_at(path) <= since:
            continue
        frame = pd.read_parquet(path)
        stem = path.name.removesuffix(SUFFIX)
        for name, label, data in zip(frame["name"], frame["label"], frame["data"]):
            found.append(ImageFile(name=f"{stem}/{name}", label=str(label),
                                   read=lambda limit=None, data=data: bytes(data)))
    return found


def accepted_at(path: Path) -> float:
    """When a batch was accepted: the UTC time in its name (what a retrain's high-water mark compares)."""
    try:
        return time.mktime(time.strptime(path.name[:15], STAMP))   # local time, as unique_stamp writes it
    except ValueError:
        return path.stat().st_mtime


def newest_batch_time() -> float:
    """The newest accepted image batch's time (0 when there is none)."""
    return max((accepted_at(p) for p in paths.BATCHES.glob(f"*{SUFFIX}")), default=0.0)
