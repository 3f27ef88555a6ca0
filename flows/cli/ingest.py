"""`torchship ingest`: a labelled batch judged by the committed contract, accepted into data/batches/ or
quarantined."""
from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.output import console, fail
from flows.environment import enter_project


def ingest(batch: Path = typer.Argument(..., help="A labelled CSV/Parquet batch (production rows with outcomes); "
                                               "for an image or text model, a folder with one subfolder of images "
                                               "or .txt files per class, or a table of them with their labels.")
           ) -> None:
    """Judge a new labelled batch by the committed contract before it joins the training set.

    Accepted: stored in data/batches/ and used by the next `torchship run` (prepare re-runs). Refused: the
    file is moved to data/quarantine/TIME-NAME/ with its report; the training set is unchanged."""
    if not batch.exists():
        fail(f"{batch} not found.")
    batch = batch.resolve()
    enter_project()
    from tasks.config import load_params
    from tasks.ingest import ingest_batch
    from tasks.workspace.lock import WorkspaceBusy, workspace_lock

    params = load_params()
    try:   # the workspace first: a run's prepare lists data/batches/ while it holds it
        with workspace_lock("this ingest", params.retrain.workspace_wait_s):
            gate, where = ingest_batch(batch, params)
    except WorkspaceBusy as exc:
        fail(f"{exc}\nNothing was written: {batch} is where it was and data/batches/ is unchanged.")
    if gate.blocks(params.validate_.warn_blocks):
        fail(f"batch refused: {gate.summary()}\n"
             f"The file and its report are in {where}/; the training set is unchanged.")
    console.print(f"[green]batch accepted[/] ({gate.summary()}): {where}. The next `torchship run` retrains on it.")


