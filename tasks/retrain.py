"""retrain: turn what was labelled since the last retrain into a training batch, at the modality's batch door
(tables: the window's rows with feedback labels, screened row by row, then judged by the contract; images: the
images `torchship ingest` accepted), stored under data/batches/ and snapshotted by DVC (`dvc add`; on the team
topology into the shared batch index, under the model's registry lock), so dvc.lock and the new version's lineage
name the data the retrain saw. The flow then re-runs the pipeline: the normal gates bless or reject the result
and the canary decides; a retrain never promotes by itself."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from tasks.core import paths
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.schema_spec import load_schema
from tasks.modalities import modality_of
from tasks.monitoring import batch_index
from tasks.monitoring.window import Window

log = logging.getLogger("torchship.retrain")


class RetrainBatch(BaseModel):
    gate: GateResult
    rows: int                        # labelled rows the window offered
    accepted_rows: int
    quarantined_rows: int
    batch: str | None = None         # the accepted file under data/batches/
    quarantine: str | None = None    # where refused rows went, with report.json
    labels_since: float
    labels_until: float


def labelled_times(params: Params) -> list[float] | None:
    """When each labelled example a retrain could learn from arrived, where those are not the request log's feedback
    (an image model learns from the images `torchship ingest` accepted, on any machine: the shared index's); None
    where they are."""
    if not paths.SCHEMA.exists():
        return None
    modality = modality_of(load_schema(paths.SCHEMA))
    if modality.labelled_times() is None:   # the window's feedback labels: no accepted batch to count
        return None
    pull_accepted(params)
    return modality.labelled_times()


def take_labelled(params: Params, window: Window, since: float, until: float) -> RetrainBatch:
    """What a retrain learns from, labelled in (since, until], judged at the modality's batch door: nothing joins the
    training set unless the gate passes, and nothing is lost (refused items are kept in data/quarantine/)."""
    schema = load_schema(paths.SCHEMA)
    pull_accepted(params)   # the batches `torchship ingest` accepted on other machines are what some modalities learn
    labelled = modality_of(schema).labelled_batch(params, schema, window, since, until)
    batch = None
    if labelled.store is not None:
        batch = str(keep_batch(params, labelled.store))
        log.info("retrain: %d labelled item(s) accepted into %s (%d quarantined)", labelled.accepted, batch,
                 labelled.quarantined)
    return RetrainBatch(gate=labelled.gate, rows=labelled.offered, accepted_rows=labelled.accepted,
                        quarantined_rows=labelled.quarantined, batch=batch, quarantine=labelled.quarantine,
                        labels_since=since, labels_until=until)


def pull_accepted(params: Params) -> None:
    """This tree's data/batches/ as the shared batch index names it: on the team topology a worker's fresh clone holds
    none of the batches `torchship ingest` accepted elsewhere (a no-op in the embedded default)."""
    log.info(batch_index.pull_shared_batches(params.tracking, params.data.registered_model_name()))


def keep_batch(params: Params, store: Callable[[], Path]) -> Path:
    """Store the accepted batch and snapshot data/batches/ with DVC, so dvc.lock and the version's lineage name it;
    on the team topology into the shared batch index (tasks/monitoring/batch_index.py)."""
    return batch_index.keep_batch(params.tracking, params.data.registered_model_name(), store)
