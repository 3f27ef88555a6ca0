"""`torchship contract suggest`: a proposed `contract:` section from reference data, for a person to review."""
from __future__ import annotations

import typer

from flows.environment import enter_project

contract_app = typer.Typer(help="The data contract: propose one from reference data.", no_args_is_help=True)


@contract_app.command("suggest")
def contract_suggest(data: str = typer.Argument(..., help="A CSV/Parquet path, `synthetic` or `sklearn:<name>`; "
                                                         "or images: a folder with one subfolder per class, a "
                                                         "manifest, `images:digits` or `images:shapes`; or texts: "
                                                         "a table with a free-text column, a folder of class "
                                                         "subfolders of .txt files, `text:tickets` or "
                                                         "`text:tweets`."),
                     target: str = typer.Option(None, help="The label column (default: data.target or the "
                                                            "built-in source's)."),
                     margin: float = typer.Option(0.1, help="Widen observed numeric ranges by this share.")) -> None:
    """Profile DATA and print a proposed `contract:` section (YAML) for a human to review and commit.

    Use it with: torchship run --params contract.yaml (the section is merged into params.yaml)."""
    enter_project()
    from tasks.config import load_params
    from tasks.contract_suggestion import suggested_contract

    params = load_params()
    text = suggested_contract(params, data, target, margin)
    typer.echo(text)
