"""`torchship ingest` and `torchship contract suggest`: the doors for new data and the data contract."""
from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.output import console, fail
from flows.environment import enter_project

contract_app = typer.Typer(help="The data contract: propose one from reference data.", no_args_is_help=True)


def ingest(batch: Path = typer.Argument(..., help="A labelled CSV/Parquet batch (production rows with outcomes).")
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

    params = load_params()
    gate, where = ingest_batch(batch, params)
    if gate.blocks(params.validate_.warn_blocks):
        fail(f"batch refused: {gate.summary()}\n"
             f"The file and its report are in {where}/; the training set is unchanged.")
    console.print(f"[green]batch accepted[/] ({gate.summary()}): {where}. The next `torchship run` retrains on it.")


@contract_app.command("suggest")
def contract_suggest(data: str = typer.Argument(..., help="A CSV/Parquet path, `synthetic` or `sklearn:<name>`; "
                                                         "or images: a folder with one subfolder per class, a "
                                                         "manifest, `images:digits` or `images:shapes`."),
                     target: str = typer.Option(None, help="The label column (default: data.target or the "
                                                            "built-in source's)."),
                     margin: float = typer.Option(0.1, help="Widen observed numeric ranges by this share.")) -> None:
    """Profile DATA and print a proposed `contract:` section (YAML) for a human to review and commit.

    Use it with: torchship run --params contract.yaml (the section is merged into params.yaml)."""
    enter_project()
    from tasks.config import load_params
    from tasks.ops.proposal import propose_contract

    params = load_params()
    text = propose_contract(params.data, data, target, margin, params.images)
    typer.echo(text)
