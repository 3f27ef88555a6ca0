"""Writing a scored file (`torchship predict FILE -o OUT`, whatever the model's modality): the output table written in
chunks to a CSV or Parquet file, every refused item listed in OUT.problems.csv, a progress bar. A modality's batch
scoring reads its inputs (tasks/modalities/<name>/batch.py); this writes what they became."""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from tasks.core.errors import DataError

CHUNK_ROWS = 4096   # items scored at once at most: the memory bound (bench/results/predict.json), not the file size
SHOWN = 5           # problems named in the error message; all of them go to the problems file
FORMATS = (".csv", ".parquet")


@dataclass
class PredictSummary:
    source: str
    output: str
    version: str
    rows: int = 0
    chunks: int = 0
    seconds: float = 0.0
    labels: dict[str, int] = field(default_factory=dict)


class FileRefused(DataError):
    """Rows of the input file break the model's contract; nothing was written but the problems file."""


def file_format(path: Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: a .csv or .parquet file is expected (got '{suffix or 'no suffix'}')")
    return suffix


class ProblemsFile:
    """Every refused (line, column, rule) as CSV, written as found; the first SHOWN kept for the message."""

    def __init__(self, path: Path, unit: str):
        self.path, self.unit = path, unit
        self.count, self.shown, self._handle = 0, [], None

    def add(self, first: int, problems: list[dict]) -> None:
        """`problems` of the items from `first` on (a problem's `row` counts from there)."""
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("w", newline="")   # stays open across add() calls; close() closes it
            self._writer = csv.writer(self._handle)
            self._writer.writerow([self.unit, "column", "rule", "message"])
        for problem in problems:
            where = first + problem["row"]
            self._writer.writerow([where, problem["field"], problem["rule"], problem["message"]])
            if len(self.shown) < SHOWN:
                self.shown.append(f"{self.unit} {where}, column '{problem['field']}': {problem['rule']} "
                                  f"({problem['message']})")
        self.count += len(problems)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


class TableWriter:
    """Appends tables to a CSV or Parquet file (types fixed by the first table)."""

    def __init__(self, path: Path, suffix: str):
        self.path, self.suffix, self._writer, self._schema = path, suffix, None, None

    def write(self, table) -> None:
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq

        if self._writer is None:
            self._schema = table.schema
            self._writer = (pq.ParquetWriter(self.path, table.schema) if self.suffix == ".parquet"
                            else pcsv.CSVWriter(self.path, table.schema))
        self._writer.write_table(table.cast(self._schema))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def scoring_progress(unit: str):
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    amount = DownloadColumn() if unit == "line" else MofNCompleteColumn()   # CSV: bytes read; Parquet: rows
    return Progress(TextColumn("predict"), BarColumn(), amount, TextColumn("{task.fields[note]}"),
                    TimeRemainingColumn(), transient=False)


class SilentProgress:
    """A progress bar that shows nothing (tests, --quiet)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *args, **kwargs):
        return 0

    def update(self, *args, **kwargs):
        pass
