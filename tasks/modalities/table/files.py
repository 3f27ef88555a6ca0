"""Reading a raw table file (CSV as text, or Parquet) and its header, with every structural problem found."""
from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from tasks.core.artifacts import redacted
from tasks.core.errors import DataError, TorchshipError
from tasks.core.problems import Problem, raise_if_any
from tasks.modalities.table.csv_table import read_csv_table


def _require_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"data file {path} not found: check data.source in params.yaml (a CSV or Parquet path, "
                        "`synthetic`, or `sklearn:<name>`).")



def table_columns(path: Path) -> list[str] | None:
    """The column names from the file's header alone (None if the header cannot be read: the full parse will
    say why). Cheap, for checks that should fail in a second rather than after minutes."""
    _require_file(path)
    try:
        if path.suffix.lower() in {".parquet", ".pq"}:
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        with path.open(newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), None)
    except Exception:  # unreadable: read_raw_table gives the precise message
        return None



def require_target(columns, target: str, origin: str) -> None:
    if target not in columns:
        raise DataError(f"{origin}: target column '{target}' does not exist (columns: "
                        f"{', '.join(map(str, list(columns)[:20]))}). Set data.target to one of them.")



def read_table(path: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """Read a CSV (all cells as text) or Parquet file, index = each row's file line (Parquet: row number);
    plus every structural problem found (ragged rows, undecodable lines, duplicate names), for the caller to
    report with the column problems in one refusal."""
    _require_file(path)
    if path.suffix.lower() not in {".parquet", ".pq"}:
        return read_csv_table(path)
    if path.stat().st_size == 0:
        raise_if_any(str(path), [Problem("is empty (rule: a Parquet file with rows)", 1)])
    try:
        table = pd.read_parquet(path)
    except MemoryError as exc:   # pyarrow's ArrowMemoryError too: the file may be sound, this process is short
        raise TorchshipError(f"{path}: reading it ran out of memory ({redacted(exc)}); that says nothing about the "
                             "file's validity. Free memory, or give this process more, and run again.") from None
    except OSError as exc:   # the disk or the file system refused the read
        raise DataError(f"{path} could not be read ({redacted(exc)}).") from None
    except Exception as exc:
        raise DataError(f"{path} is not a valid Parquet file ({redacted(exc)}).") from None
    table.index = pd.RangeIndex(1, len(table) + 1)  # Parquet has rows, not lines
    return table, []



def read_raw_table(path: Path) -> pd.DataFrame:
    """`read_table`, refusing the file (with every structural problem) when it has any."""
    table, problems = read_table(path)
    raise_if_any(str(path), problems)
    return table
