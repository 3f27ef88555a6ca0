"""Batch scoring of texts: `torchship predict FILE|DIR -o OUT` with a registered text model, by the service's own rules
(tasks/modalities/text/serving.py) and graph.

- Same rules: a text over the model's character limit, or one that is not UTF-8 text, is refused as a request's would
  be; the served graph tokenizes, as it does for the service.
- Flat memory: `chunk` texts are read, scored and written at a time (a CSV in chunks of rows, a Parquet file by record
  batches, a folder's files one chunk at a time), whatever the source's size.
- All or nothing, like a table file: a text the service would refuse refuses the output (no half file); every refused
  text goes to OUT.problems.csv with its rule.
Output: one row per text: its name (`row <n>` of a table, from 1, or a file's path relative to the folder), the
label it came with (the label column `data.target` names, or its class folder), the prediction and each class's
probability."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tasks.core.errors import DataError
from tasks.core.scored_files import (
    FileRefused,
    PredictSummary,
    ProblemsFile,
    SilentProgress,
    TableWriter,
    file_format,
    scoring_progress,
)
from tasks.modalities.text.descriptors import lone_surrogate
from tasks.modalities.text.graph import TEXT_INPUT
from tasks.modalities.text.sources import PARQUET_SUFFIXES, SUFFIX, read_text_file

Item = tuple[str, str | None, str | None, str | None]   # (name, label, text, why it has none)


def table_chunks(path: Path, column: str, target: str | None, chunk: int) -> Iterator[list[Item]]:
    """A table's rows as items, `chunk` at a time (the text column named, or the model's own)."""
    import pandas as pd

    if path.suffix.lower() in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        frames = (batch.to_pandas() for batch in table.iter_batches(
            batch_size=chunk, columns=[c for c in (column, target) if c in names]))
    else:
        frames = pd.read_csv(path, dtype=str, keep_default_na=False, chunksize=chunk, encoding="utf-8-sig",
                             encoding_errors="surrogateescape")
    start = 0
    for frame in frames:
        if column not in frame.columns:
            raise DataError(f"{path}: no text column '{column}' (the model reads that column; name another with "
                            f"text.text_column); it has {list(frame.columns)}")
        labels = frame[target].astype(str).tolist() if target and target in frame.columns else [None] * len(frame)
        texts = ["" if pd.isna(v) else str(v) for v in frame[column]]
        yield [(f"row {start + i + 1}", label, text, None) for i, (text, label) in enumerate(zip(texts, labels))]
        start += len(frame)


def folder_chunks(root: Path, max_chars: int, chunk: int) -> Iterator[list[Item]]:
    """A folder's .txt files (class subfolders give labels) as items, `chunk` files read at a time."""
    files = sorted(p for p in root.rglob(f"*{SUFFIX}") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise DataError(f"{root} holds no {SUFFIX} files to score")
    for start in range(0, len(files), chunk):
        items = []
        for path in files[start:start + chunk]:
            relative = path.relative_to(root)
            label = relative.parts[0] if len(relative.parts) > 1 else None
            record = read_text_file(path, relative.as_posix(), label, max_chars)
            items.append((record.name, label, record.text, record.error))
        yield items


def refusal(index: int, name: str, text: str | None, error: str | None, max_chars: int) -> dict | None:
    """The problem the service would refuse a text with (as tasks/core/scored_files.py ProblemsFile keeps it), else
    None."""
    if text is None:
        rule, message = "decodable", error or "not text"
    elif len(text) > max_chars:
        rule, message = "size limit", f"{len(text):,} characters is over the limit of {max_chars:,}"
    elif why := lone_surrogate(text):
        rule, message = "unicode", f"{why} (the source is not UTF-8 there)"
    else:
        return None
    return {"row": index, "field": TEXT_INPUT, "rule": rule, "message": f"{name}: {message}"}


def scored_table(variant, kept: list[tuple[str, str | None, str]]):
    """The output rows of accepted (name, label, text) items: the label served and every class's probability."""
    import pyarrow as pa

    rows = variant.decoder.empty()
    rows.texts = [text for _, _, text in kept]
    probabilities = variant.split(variant.score(rows))[0]
    predicted = variant.labels(probabilities)
    classes = variant.schema.classes
    columns = {"name": [n for n, _, _ in kept], "label": [label for _, label, _ in kept],
               "prediction": [classes[i] for i in predicted]}
    table = pa.table({key: pa.array(values, type=pa.string()) for key, values in columns.items()})
    for i, name in enumerate(classes):
        table = table.append_column(f"probability_{name}", pa.array(probabilities[:, i].astype(np.float64)))
    return table, np.bincount(predicted, minlength=len(classes))


def predict_texts(source: Path, output: Path, variant, column: str, target: str | None = None,
                  chunk: int = 1024, show_progress: bool = True) -> PredictSummary:
    """Score every text of `source` with a loaded text variant into `output` (.csv or .parquet)."""
    from tasks.core.artifacts import write_atomic

    out_suffix, source = file_format(output), Path(source)
    if not source.exists():
        raise DataError(f"{source}: no such file or folder")
    max_chars = variant.decoder.limits.max_chars
    chunks = folder_chunks(source, max_chars, chunk) if source.is_dir() else \
        table_chunks(source, column, target, chunk)
    summary = PredictSummary(str(source), str(output), variant.version)
    problems = ProblemsFile(output.with_name(output.name + ".problems.csv"), "text")
    problems.path.unlink(missing_ok=True)
    counts = np.zeros(len(variant.schema.classes), dtype=np.int64)
    started, seen = time.perf_counter(), 0

    def write(tmp: Path) -> None:
        nonlocal seen
        writer = TableWriter(tmp, out_suffix)
        with scoring_progress("row") if show_progress else SilentProgress() as bar:
            task = bar.add_task("predict", total=None, note="")
            for items in chunks:
                found = [refusal(seen + i, name, text, error, max_chars)
                         for i, (name, _, text, error) in enumerate(items)]
                problems.add(0, [problem for problem in found if problem])
                seen, summary.chunks = seen + len(items), summary.chunks + 1
                if problems.count == 0:
                    table, predicted = scored_table(variant, [item[:3] for item in items])
                    writer.write(table)
                    counts[:] += predicted
                    summary.rows += len(items)
                bar.update(task, completed=seen, note=f"{summary.rows:,} scored, {problems.count} refused")
        writer.close()
        problems.close()
        if problems.count:
            raise FileRefused(f"{source}: {problems.count} text(s) the service would refuse, so no predictions were "
                              f"written. First: {'; '.join(problems.shown)}. Every one is listed in {problems.path}.")
        if summary.rows == 0:
            raise DataError(f"{source}: no texts to score")

    write_atomic(output, write)
    summary.labels = {label: int(n) for label, n in zip(variant.schema.classes, counts)}
    summary.seconds = time.perf_counter() - started
    return summary
