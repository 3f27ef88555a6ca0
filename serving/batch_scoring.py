"""Batch scoring: `torchship predict FILE --output OUT` scores a CSV or Parquet file with a registered version,
by the service's own rules and bytes, in memory bounded by the chunk size rather than the file's size.

- Same bytes: the version's model.onnx, checked against its `artifact_sha256` tag (tasks.registry.read
  .verified_onnx, as the service's registry watcher does), opened and warmed as the service opens it.
- Same rules: each chunk of rows goes through the service's request decoder (tasks/modalities/table/serving.py) as a
request
  body would: its one-pass check, then the pydantic verdict that names row, field and rule. A CSV cell is given
  the type a client would send (a number where the schema wants one, an empty cell as null, anything else as the
  text it is, which the check then refuses).
- Bad rows refuse the whole file: no output is written, every problem is listed in OUT.problems.csv (file line,
  column, rule) and the first few in the error. Why not quarantine: the output must hold one prediction per
  input row, so it can be joined back without a reader noticing a gap; a service request is all-or-nothing too.
- Bounded memory: CSV in pandas chunks, Parquet by record batches; each chunk is scored and appended to a temp
  file beside OUT, renamed onto OUT only when every row passed (a crash or a refusal leaves no half file).
"""
from __future__ import annotations

import csv
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.refusals import RowsRefused
from tasks.modalities.table.serving import RowDecoder, Rows, validate_rows

CHUNK_ROWS = 4096   # rows scored at once: the memory bound (bench/results/predict.json), not the file size
SHOWN = 5           # problems named in the error message; all of them go to the problems file
FORMATS = (".csv", ".parquet")


@dataclass
class Chunk:
    """Rows of the input file: `first` is the 1-based line (CSV, header = line 1) or row (Parquet) of the first."""

    first: int
    records: list[dict]       # feature -> value as a client would send it
    finite: bool              # no NaN/inf among the numbers (JSON cannot carry them: such rows are judged directly)
    passthrough: dict         # the file's other columns (ids, labels), copied to the output


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


def require_columns(path: Path, columns: list[str], features: list[str]) -> None:
    missing = [name for name in features if name not in columns]
    if missing:
        raise DataError(f"{path}: the model needs column(s) {missing} that the file does not have "
                        f"(it has {columns[:10]}{' ...' if len(columns) > 10 else ''})")


def client_values(texts: pd.Series, numeric: bool) -> tuple[list, bool]:
    """A CSV column (text, empty = None) as a client's JSON values: numbers parsed where the schema wants them
    (what does not parse stays text, for the check to refuse by name). Also whether every number is finite."""
    if not numeric:
        return [value if isinstance(value, str) else None for value in texts.tolist()], True   # a null is NaN
    parsed = pd.to_numeric(texts, errors="coerce").to_numpy(dtype=np.float64)
    missing = texts.isna().to_numpy()
    values = parsed.astype(object)
    unparsed = np.isnan(parsed) & ~missing
    values[unparsed] = texts.to_numpy()[unparsed]
    values[missing] = None
    return values.tolist(), not np.isinf(parsed).any()


def csv_chunks(path: Path, decoder: RowDecoder, chunk_rows: int, advance) -> Iterator[Chunk]:
    features = set(decoder.schema.feature_names)
    numeric = set(decoder.number_names)
    with open(path, "rb") as handle:
        # Every cell as text (only an empty one is null) and blank lines kept: line numbers stay the file's.
        reader = pd.read_csv(handle, dtype=str, keep_default_na=False, na_values=[""], skip_blank_lines=False,
                             chunksize=chunk_rows)
        line = 2
        for frame in reader:
            if line == 2:
                require_columns(path, list(frame.columns), decoder.schema.feature_names)
            columns, finite = {}, True
            for name in decoder.schema.feature_names:
                columns[name], ok = client_values(frame[name], name in numeric)
                finite &= ok
            records = [dict(zip(columns, values)) for values in zip(*columns.values())]
            others = {name: frame[name].tolist() for name in frame.columns if name not in features}
            yield Chunk(line, records, finite, others)
            line += len(frame)
            advance(handle.tell())


def parquet_chunks(path: Path, decoder: RowDecoder, chunk_rows: int, advance) -> Iterator[Chunk]:
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    columns = source.schema_arrow.names
    require_columns(path, columns, decoder.schema.feature_names)
    features = decoder.schema.feature_names
    row = 1
    for batch in source.iter_batches(batch_size=chunk_rows):
        records = batch.select(features).to_pylist()   # nulls are None, NaN stays a float (refused: not finite)
        finite = all(v is None or not isinstance(v, float) or math.isfinite(v)
                      for name in decoder.number_names for v in batch.column(name).to_pylist())
        others = {name: batch.column(name) for name in columns if name not in set(features)}
        yield Chunk(row, records, finite, others)
        row += batch.num_rows
        advance(row - 1)


def check_chunk(decoder: RowDecoder, chunk: Chunk) -> Rows:
    """The chunk's rows as the service accepts a request body, or RowsRefused naming row (in the chunk), field
    and rule. NaN/inf cannot travel as JSON (a serialiser would write null): those chunks go to the verdict
    directly, which refuses every non-finite number."""
    if chunk.finite:
        return decoder.decode(orjson.dumps({"rows": chunk.records}))
    raise RowsRefused(validate_rows(decoder.row_type, chunk.records))


class ProblemsFile:
    """Every refused (line, column, rule) as CSV, written as found; the first SHOWN kept for the message."""

    def __init__(self, path: Path, unit: str):
        self.path, self.unit = path, unit
        self.count, self.shown, self._handle = 0, [], None

    def add(self, chunk: Chunk, problems: list[dict]) -> None:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("w", newline="")   # stays open across add() calls; close() closes it
            self._writer = csv.writer(self._handle)
            self._writer.writerow([self.unit, "column", "rule", "message"])
        for problem in problems:
            where = chunk.first + problem["row"]
            self._writer.writerow([where, problem["field"], problem["rule"], problem["message"]])
            if len(self.shown) < SHOWN:
                self.shown.append(f"{self.unit} {where}, column '{problem['field']}': {problem['rule']} "
                                  f"({problem['message']})")
        self.count += len(problems)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def prediction_table(chunk: Chunk, classes: list[str], probabilities: np.ndarray, predicted: np.ndarray, unit: str):
    """The output rows of one chunk: the file's other columns, the row's line, the label (`predicted`: the class
    indices the version serves), each class's probability."""
    import pyarrow as pa

    columns = {name: pa.array(values, type=pa.string()) if isinstance(values, list) else values
               for name, values in chunk.passthrough.items()}
    columns[unit] = pa.array(np.arange(chunk.first, chunk.first + len(probabilities), dtype=np.int64))
    columns["prediction"] = pa.array([classes[i] for i in predicted], type=pa.string())
    for i, label in enumerate(classes):
        columns[f"probability_{label}"] = pa.array(probabilities[:, i].astype(np.float64))
    return pa.table(columns)


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


def predict_file(source: Path, output: Path, variant, chunk_rows: int = CHUNK_ROWS,
                 show_progress: bool = True) -> PredictSummary:
    """Score `source` with a loaded serving variant (serving/variants.py) into `output` (.csv or .parquet), chunk
    by chunk. Raises FileRefused (output untouched, OUT.problems.csv listing every problem) or DataError."""
    from tasks.core.artifacts import write_atomic

    source, output = Path(source), Path(output)
    suffix, out_suffix = file_format(source), file_format(output)
    if not source.is_file():
        raise DataError(f"{source}: no such file")
    unit = "line" if suffix == ".csv" else "row"
    if suffix == ".csv":
        total, chunks = source.stat().st_size, csv_chunks
    else:
        import pyarrow.parquet as pq

        total, chunks = pq.ParquetFile(source).metadata.num_rows, parquet_chunks
    summary = PredictSummary(str(source), str(output), variant.version)
    problems = ProblemsFile(output.with_name(output.name + ".problems.csv"), unit)
    problems.path.unlink(missing_ok=True)   # a previous run's list no longer describes this file
    classes = variant.schema.classes
    counts = np.zeros(len(classes), dtype=np.int64)
    started = time.perf_counter()

    def write(tmp: Path) -> None:
        writer = TableWriter(tmp, out_suffix)
        with scoring_progress(unit) if show_progress else SilentProgress() as bar:
            task = bar.add_task("predict", total=total, note="")
            for chunk in chunks(source, variant.decoder, chunk_rows,
                                lambda done: bar.update(task, completed=done,
                                                        note=f"{summary.rows:,} rows, {problems.count:,} refused")):
                summary.chunks += 1
                try:
                    rows = check_chunk(variant.decoder, chunk)
                except RowsRefused as exc:
                    problems.add(chunk, exc.problems)
                    continue
                if problems.count:   # the file is refused already: only look for the rest of its problems
                    continue
                probabilities = variant.score(rows)
                predicted = variant.labels(probabilities)
                counts[:] += np.bincount(predicted, minlength=len(classes))
                writer.write(prediction_table(chunk, classes, probabilities, predicted, unit))
                summary.rows += len(rows)
        writer.close()
        problems.close()
        if problems.count:
            raise FileRefused(f"{source}: {problems.count} problem(s) in its rows, so no predictions were written. "
                              f"First: {'; '.join(problems.shown)}. Every one is listed in {problems.path}; "
                              f"fix or drop those rows and run again (the rules are the model's contract, as "
                              f"the service applies them)")
        if summary.rows == 0:
            raise DataError(f"{source}: no rows to score")

    try:
        write_atomic(output, write)
    finally:
        problems.close()
    summary.labels = {label: int(n) for label, n in zip(classes, counts)}
    summary.seconds = time.perf_counter() - started
    return summary


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


def load_version(params, version: str | None = None, alias: str | None = None, client=None):
    """The registered version (by number, or by alias: champion unless told) as the service loads it: verified
    bytes, opened and warmed."""
    from serving.variants import bytes_variant
    from tasks.registry.read import CHAMPION, alias_version, registry_client, verified_onnx

    client = client or registry_client(params.tracking)
    name = params.data.registered_model_name()
    if version is None:
        alias = alias or CHAMPION
        held = alias_version(client, name, alias)
        if held is None:
            raise DataError(f"{name} has no version with alias '{alias}': see `torchship status`, or pass --version")
        version = str(held.version)
    return bytes_variant(alias or f"v{version}", str(version), verified_onnx(client, name, version),
                         params.runtime.threads, params.images)
