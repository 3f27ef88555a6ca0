"""ingest: the gate for new labelled batches (production data for retraining). A batch is judged by the
committed contract before it joins the training set; a failing batch is moved to quarantine with its report
and the training set stays as it was. Accepted batches are read by `prepare` after the source."""
from __future__ import annotations

import logging
from pathlib import Path

from tasks.contract import load_schema
from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.quarantine import quarantine_move
from tasks.monitoring import batch_index
from tasks.monitoring.batch_gate import accept_batch, contract_from_schema, judge_batch

log = logging.getLogger("torchship.ingest")


def ingest_batch(path: Path, params: Params) -> tuple[GateResult, Path]:
    """Accept the batch into data/batches/ (and the shared index on the team topology), or move it to
    data/quarantine/ with its report."""
    contract = params.contract or contract_from_schema(load_schema(paths.SCHEMA))
    gate, typed = judge_batch(path, contract, params)
    if gate.blocks(params.validate_.warn_blocks) or typed is None:
        folder = quarantine_move(path)
        write_json_atomic(folder / "report.json", gate.model_dump())
        return gate.model_copy(update={"evidence": str(folder / "report.json")}), folder
    # Not snapshotted here in the embedded default (the next run's source fingerprint names it); on the team
    # topology into the shared index, so a run on any worker trains on it.
    return gate, batch_index.keep_batch(params.tracking, params.data.registered_model_name(),
                                        lambda: accept_batch(typed, path.stem), snapshot=False)

