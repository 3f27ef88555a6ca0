"""Read a CSV leniently, in one pass: rows that break the file's shape (ragged, undecodable) are set aside and
reported, the rest are read as text, so column problems are found in the same run as structural ones."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from tasks.core.problems import SHOWN, Problem, raise_if_any

ENCODING_FIX = "Export the file as UTF-8 CSV (or Parquet)."


def read_csv_table(path: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """All cells as text, indexed by each row's physical file line; plus every structural problem found.
    What makes reading anything impossible (empty file, no header, not text, no rows) raises at once."""
    origin = str(path)
    data = path.read_bytes()
    if not data:
        raise_if_any(origin, [Problem("is empty (rule: a header line and at least one row)", 1)])
    text, problems = _decode(data, origin)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise_if_any(origin, problems + [Problem(f"is not a valid CSV file ({exc})", 1)])
    if not header or all(not cell.strip() for cell in header):
        raise_if_any(origin, problems + [Problem("has no header line (rule: line 1 names the columns)", 1,
                                                 fix="Add one.")])
    header, duplicate = _unique_names(header)
    if duplicate:
        problems.append(Problem(f"repeats column names {duplicate} on line 1 (rule: unique names)", len(duplicate),
                                fix="Rename them so each column is unique."))
    rows, lines, ragged = _read_rows(reader, len(header), origin, problems)
    if ragged:
        problems.append(Problem(f"has ragged rows (rule: every row has the header's {len(header)} fields)", len(ragged),
                                examples=[f"line {line}: {n} fields" for line, n in ragged[:SHOWN]],
                                fix="Fix or remove those lines (a stray delimiter or missing quote is typical)."))
    if not rows:
        raise_if_any(origin, problems + [Problem("has a header but no data rows (rule: at least one data row)", 1)])
    return _as_text_frame(header, rows, lines), problems


def _decode(data: bytes, origin: str) -> tuple[str, list[Problem]]:
    """UTF-8 text; lines that are not UTF-8 are reported (and read with replacement characters) unless the
    file is not text at all (its header, or most lines, undecodable)."""
    try:
        return data.decode("utf-8-sig"), []
    except UnicodeDecodeError as exc:
        first_bad = exc.start
    raw_lines = data.split(b"\n")
    bad = [(number, at) for number, line in enumerate(raw_lines, start=1) if (at := _bad_byte(line)) is not None]
    if bad[0][0] == 1 or len(bad) > len(raw_lines) / 2:
        raise_if_any(origin, [Problem(f"is not a valid CSV file (not UTF-8 text at byte {first_bad})", len(bad),
                                      fix=ENCODING_FIX)])
    examples = [f"line {number}, byte {at + 1}: "
                f"{raw_lines[number - 1][max(0, at - 12):at + 12].decode('utf-8', 'replace')!r}"
                for number, at in bad[:SHOWN]]
    return data.decode("utf-8-sig", errors="replace"), [Problem("has lines that are not UTF-8 text", len(bad),
                                                                examples=examples, fix=ENCODING_FIX)]


def _bad_byte(line: bytes) -> int | None:
    """Offset of the first byte that is not UTF-8, or None."""
    try:
        line.decode("utf-8")
        return None
    except UnicodeDecodeError as exc:
        return exc.start


def _unique_names(header: list[str]) -> tuple[list[str], list[str]]:
    """Repeated names get a ` (2)` suffix so the rest of the file can still be checked; the repeats are named."""
    seen: dict[str, int] = {}
    names = []
    for name in header:
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return names, sorted(name for name, count in seen.items() if count > 1)


def _read_rows(reader, width: int, origin: str, problems: list[Problem]):
    """Good rows with their first physical line; ragged rows as (line, fields). A broken quote ends the read
    (the csv module cannot resynchronise), reported as a problem of its own."""
    rows, lines, ragged = [], [], []
    start = reader.line_num + 1
    try:
        for row in reader:
            if row:
                if len(row) == width:
                    rows.append(row)
                    lines.append(start)
                else:
                    ragged.append((start, len(row)))
            start = reader.line_num + 1
    except csv.Error as exc:
        problems.append(Problem(f"is not valid CSV from here on ({exc}); rows after it were not read", 1,
                                examples=[f"line {start}"]))
    return rows, lines, ragged


def _as_text_frame(header: list[str], rows: list[list[str]], lines: list[int]) -> pd.DataFrame:
    """Rows -> text frame with pandas' own missing-value rules (empty, NA, null... are missing), as before."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(range(len(header)))  # positional names: the real ones may contain anything
    writer.writerows(rows)
    buffer.seek(0)
    table = pd.read_csv(buffer, dtype=str, keep_default_na=True, skip_blank_lines=False)
    table.columns = header
    table.index = lines
    return table
