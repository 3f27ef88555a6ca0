"""The image batch door: labelled images handed to `torchship ingest` (a folder of class subfolders, or a manifest),
judged image by image (tasks/modalities/image/batches.py), and the images a retrain learns from (those ingest
accepted: the request log keeps no pixels)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tasks.core import paths
from tasks.core.gate import GateResult
from tasks.modalities.interface import Labelled


def ingest_verdict(path: Path, params, schema) -> Labelled:
    """Refused images are copied to quarantine with the report; within the share the rest may join data/batches/,
    else the whole batch is refused (the folder stays where it is)."""
    from tasks.modalities.image.batches import judge_image_batch, write_image_batch
    from tasks.modalities.image.contract import ImageContract
    from tasks.modalities.image.prepare import quarantine_images
    from tasks.modalities.image.sources import folder_images, manifest_images

    files = folder_images(path) if path.is_dir() else manifest_images(path, schema.target, params.images.path_column)
    contract = params.contract if isinstance(params.contract, ImageContract) else None
    gate, accepted, refused = judge_image_batch(files, str(path), schema, params.images, contract)
    quarantine = None
    if refused:
        folder = quarantine_images(files, refused, str(path), len(files), 1.0)
        gate, quarantine = gate.model_copy(update={"evidence": str(folder / "report.json")}), str(folder)
    store = None if gate.blocks(params.validate_.warn_blocks) else (lambda: write_image_batch(accepted, path.stem))
    return Labelled(gate=gate, offered=len(files), accepted=len(accepted) if store else 0, quarantined=len(refused),
                    store=store, quarantine=quarantine)


def ingested_times() -> list[float]:
    """When each image `torchship ingest` accepted arrived."""
    from tasks.modalities.image.batches import SUFFIX, accepted_at

    times = []
    for path in sorted(paths.BATCHES.glob(f"*{SUFFIX}")):
        times += [accepted_at(path)] * len(pd.read_parquet(path, columns=["name"]))
    return times


def ingested_batch(since: float, until: float) -> Labelled:
    """The images `torchship ingest` accepted in (since, until] (already judged at the image batch door, in
    data/batches/): kept as they are, and snapshotted like a table's window."""
    from tasks.modalities.image.batches import SUFFIX, accepted_at

    batches = [p for p in sorted(paths.BATCHES.glob(f"*{SUFFIX}")) if since < accepted_at(p) <= until]
    images = sum(len(pd.read_parquet(p, columns=["name"])) for p in batches)
    if not batches:
        gate = GateResult(gate="image batch", status="fail", reasons=[
            "no labelled images were ingested since the last retrain: an image model learns from the images "
            "`torchship ingest DIR` accepts (the request log keeps no pixels)"])
        return Labelled(gate=gate, offered=0, accepted=0, quarantined=0, store=None)
    gate = GateResult(gate="image batch", status="pass",
                      reasons=[f"{images} labelled images in {len(batches)} ingested batch(es)"])
    return Labelled(gate=gate, offered=images, accepted=images, quarantined=0, store=lambda: batches[-1])
