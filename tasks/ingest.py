"""ingest: the gate for new labelled batches (production data for retraining). A batch is judged at its modality's
batch door (tables: by the committed contract; images: image by image) before it joins the training set; what is
refused goes to quarantine with its report and the training set stays as it was. Accepted batches are read by
`prepare` after the source."""
from __future__ import annotations

import logging
from pathlib import Path

from tasks.core import paths
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.schema_spec import load_schema
from tasks.modalities import modality_of
from tasks.monitoring import batch_index

log = logging.getLogger("torchship.ingest")


def ingest_batch(path: Path, params: Params) -> tuple[GateResult, Path]:
    """Accept the batch into data/batches/ (and the shared index on the team topology), or keep what was refused in
    data/quarantine/ with its report; returns the gate and where the batch went."""
    schema = load_schema(paths.SCHEMA)
    labelled = modality_of(schema).judge_batch(path, params, schema)
    if labelled.store is None:
        evidence = labelled.gate.evidence
        return labelled.gate, Path(labelled.quarantine or (Path(evidence).parent if evidence else path))
    # Not snapshotted here in the embedded default (the next run's source fingerprint names it); on the team
    # topology into the shared index, so a run on any worker trains on it.
    return labelled.gate, batch_index.keep_batch(params.tracking, params.data.registered_model_name(),
                                                 labelled.store, snapshot=False)
