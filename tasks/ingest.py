"""ingest: the gate for new labelled batches (production data for retraining). A batch is judged by the
committed contract before it joins the training set; a failing batch is moved to quarantine with its report
and the training set stays as it was. Accepted batches are read by `prepare` after the source."""
from __future__ import annotations

import logging
from pathlib import Path

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.quarantine import quarantine_move
from tasks.core.schema_spec import load_schema
from tasks.monitoring import batch_index
from tasks.monitoring.batch_gate import accept_batch, contract_from_schema, judge_batch

log = logging.getLogger("torchship.ingest")


def ingest_images(path: Path, params: Params, schema) -> tuple[GateResult, Path]:
    """An image model's batch: a folder (one subfolder per class) or a manifest of labelled images, judged image by
    image (tasks/modalities/image/batches.py). Refused images are copied to quarantine with the report; within the
    share the
    rest join data/batches/, else the whole batch is refused (the folder stays where it is)."""
    from tasks.modalities.image.batches import judge_image_batch, write_image_batch
    from tasks.modalities.image.contract import ImageContract
    from tasks.modalities.image.prepare import quarantine_images
    from tasks.modalities.image.sources import folder_images, manifest_images

    files = folder_images(path) if path.is_dir() else manifest_images(path, schema.target, params.images.path_column)
    contract = params.contract if isinstance(params.contract, ImageContract) else None
    gate, accepted, refused = judge_image_batch(files, str(path), schema, params.images, contract)
    if refused:
        folder = quarantine_images(files, refused, str(path), len(files), 1.0)
        gate = gate.model_copy(update={"evidence": str(folder / "report.json")})
    if gate.blocks(params.validate_.warn_blocks):
        return gate, Path(gate.evidence).parent if gate.evidence else path
    return gate, batch_index.keep_batch(params.tracking, params.data.registered_model_name(),
                                        lambda: write_image_batch(accepted, path.stem), snapshot=False)


def ingest_batch(path: Path, params: Params) -> tuple[GateResult, Path]:
    """Accept the batch into data/batches/ (and the shared index on the team topology), or move it to
    data/quarantine/ with its report (an image batch: tasks/modalities/image/batches.py)."""
    schema = load_schema(paths.SCHEMA)
    if schema.is_image:
        return ingest_images(path, params, schema)
    contract = params.contract or contract_from_schema(schema)
    gate, typed = judge_batch(path, contract, params)
    if gate.blocks(params.validate_.warn_blocks) or typed is None:
        folder = quarantine_move(path)
        write_json_atomic(folder / "report.json", gate.model_dump())
        return gate.model_copy(update={"evidence": str(folder / "report.json")}), folder
    # Not snapshotted here in the embedded default (the next run's source fingerprint names it); on the team
    # topology into the shared index, so a run on any worker trains on it.
    return gate, batch_index.keep_batch(params.tracking, params.data.registered_model_name(),
                                        lambda: accept_batch(typed, path.stem), snapshot=False)

