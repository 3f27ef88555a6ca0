"""`torchship predict`: score a CSV or Parquet file (or, for an image model, a folder or a manifest of images; for a
text model, a table's text column or a folder of .txt files) with a registered version, by the service's rules."""
from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.output import console, fail
from flows.environment import enter_project


def predict(source: Path = typer.Argument(..., help="The rows to score: a .csv (header line first) or .parquet file "
                                                    "with the model's feature columns (other columns are copied "
                                                    "to the output). For an image model: a folder of images (class "
                                                    "subfolders optional) or a manifest with images.path_column. "
                                                    "For a text model: a CSV or Parquet file with its text column, "
                                                    "or a folder of .txt files."),
            output: Path = typer.Option(..., "--output", "-o", help="Where the predictions go (.csv or .parquet)."),
            version: str = typer.Option(None, help="The registered version to score with (default: the alias)."),
            alias: str = typer.Option(None, help="The alias whose version scores (default: champion)."),
            chunk_rows: int = typer.Option(4096, min=1, help="Rows (images: at most 1,024) read, checked and scored "
                                                              "at once: what bounds the memory, whatever the "
                                                              "file's size.")) -> None:
    """Score a file with the same model bytes (sha256-checked) and contract checks as the service.

    Output: the file's non-feature columns, its line (CSV, header = line 1) or row (Parquet), the predicted
    label and each class's probability. A row the service would refuse refuses the whole file: nothing is
    written but OUTPUT.problems.csv, which names every bad line, column and rule."""
    if version is not None and alias is not None:
        fail("give --version or --alias, not both")
    source, output = source.resolve(), output.resolve()   # the user's folder, before entering the project's
    enter_project()
    from serving.batch import run
    from tasks.config import load_params

    summary = run(load_params(), source, output, version, alias, chunk_rows)
    shares = ", ".join(f"{label} {n / max(summary.rows, 1):.1%}" for label, n in summary.labels.items())
    console.print(f"[green]scored[/] {summary.rows:,} rows of {summary.source} with v{summary.version} in "
                  f"{summary.seconds:.1f} s ({summary.chunks} chunks) -> {summary.output}\n  predicted: {shares}",
                  highlight=False, soft_wrap=True)   # paths stay whole: copyable, never folded mid-name
