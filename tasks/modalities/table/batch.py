"""Batch scoring of a table: `torchship predict FILE -o OUT` with a registered table model, by the service's own
rules and bytes, in memory bounded by the chunk size rather than the file's size.

- Same rules: each chunk of rows goes through the service's request decoder (tasks/modalities/table/serving.py) as a
  request body would: its one-pass check, then the pydantic verdict that names row, field and rule. A CSV cell is
  given the type a client would send (a number where the schema wants one, an empty cell as null, anything else as
  the text it is, which the check then refuses).
- Bad rows refuse the whole file: no output is written, every problem is listed in OUT.problems.csv (file line,
  column, rule) and the first few in the error. Why not quarantine: the output must hold one prediction per
  input row, so it can be joined back without a reader noticing a gap; a service request is all-or-nothing too.
- Bounded memory: CSV in pandas chunks, Parquet by record batches; each chunk is scored and appended to a temp
  file beside OUT, renamed onto OUT only when every row passed (a crash or a refusal leaves no half file).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.refusals import RowsRefused, validate_rows
from tasks.core.scored_files import (
    CHUNK_ROWS,
    FileRefused,
    PredictSummary,
    ProblemsFile,
    SilentProgress,
    TableWriter,
    file_format,
    scoring_progress,
)


@dataclass
class Chunk:
    """Rows of the input file: `first` is the 1-based line (CSV, header = line 1) or row (Parquet) of the first."""

    first: int
    records: list[dict]       # feature -> value as a client would send it
    finite: bool              # no NaN/inf among the numbers (JSON cannot carry them: such rows are judged directly)
    passthrough: dict         # the file's other columns (ids, labels), copied to the output


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


def csv_chunks(path: Path, decoder, chunk_rows: int, advance) -> Iterator[Chunk]:
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


def parquet_chunks(path: Path, decoder, chunk_rows: int, advance) -> Iterator[Chunk]:
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


def check_chunk(decoder, chunk: Chunk):
    """The chunk's rows as the service accepts a request body, or RowsRefused naming row (in the chunk), field
    and rule. NaN/inf cannot travel as JSON (a serialiser would write null): those chunks go to the verdict
    directly, which refuses every non-finite number."""
    if chunk.finite:
        return decoder.decode(orjson.dumps({"rows": chunk.records}))
    raise RowsRefused(validate_rows(decoder.row_type, chunk.records))


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
                    problems.add(chunk.first, exc.problems)
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
