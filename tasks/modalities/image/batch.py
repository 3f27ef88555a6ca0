"""Batch scoring of images: `torchship predict DIR|MANIFEST -o OUT` with a registered image model, by the service's
own rules and bytes (tasks/modalities/table/batch.py does tables).

- Same rules: each image is read as a request's would be (tasks/modalities/image/decode.py: the size limits before
  decoding, the model's mode, the one resize rule), so a file the service would refuse is refused here.
- Flat memory: `chunk` images are read, scored and written at a time, whatever the folder's size.
- All or nothing, like a table file: an image the service would refuse refuses the output (no half file); every
  refused image goes to OUT.problems.csv with its rule.
Output: one row per image: its name (path relative to the folder, or the manifest's path), the label it came with
(its class folder, or the manifest's label column when data.target names one), the prediction and each class's
probability."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tasks.core.errors import DataError
from tasks.core.scored_files import (
    SHOWN,
    FileRefused,
    PredictSummary,
    SilentProgress,
    TableWriter,
    file_format,
    scoring_progress,
)
from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.decode import fit_size, inspect_image
from tasks.modalities.image.sources import ImageFile, folder_images, manifest_images

CHUNK_IMAGES = 256
MAX_CHUNK = 1024   # images scored at once at most (a chunk of rows is far smaller in memory)


def image_files(source: Path, path_column: str, target: str | None) -> list[ImageFile]:
    """A folder's images (labels from class folders, when there are any), or a manifest's."""
    if source.is_dir():
        return folder_images(source)
    if not source.is_file():
        raise DataError(f"{source}: no such folder or manifest")
    return manifest_images(source, target, path_column, labels_required=False)


def predict_images(source: Path, output: Path, variant, path_column: str = "path", target: str | None = None,
                   chunk: int = CHUNK_IMAGES, show_progress: bool = True) -> PredictSummary:
    """Score every image of `source` with a loaded image variant into `output` (.csv or .parquet)."""
    import pyarrow as pa

    from tasks.core.artifacts import write_atomic

    out_suffix = file_format(output)
    files = image_files(Path(source), path_column, target)
    decoder, classes = variant.decoder, variant.schema.classes
    summary = PredictSummary(str(source), str(output), variant.version)
    problems_path = output.with_name(output.name + ".problems.csv")
    problems_path.unlink(missing_ok=True)
    problems: list[tuple[str, str, str]] = []
    counts = np.zeros(len(classes), dtype=np.int64)
    started = time.perf_counter()

    def write(tmp: Path) -> None:
        writer = TableWriter(tmp, out_suffix)
        with scoring_progress("row") if show_progress else SilentProgress() as bar:
            task = bar.add_task("predict", total=len(files), note="")
            for start in range(0, len(files), chunk):
                part = files[start:start + chunk]
                rows, kept = decoder.empty(), []
                for file in part:
                    pixels, stats, rule = read_one(file, decoder)
                    if pixels is None:
                        problems.append((file.name, *rule))
                        continue
                    rows.pixels.append(pixels)
                    rows.stats.append(stats)
                    kept.append(file)
                summary.chunks += 1
                bar.update(task, completed=start + len(part), note=f"{summary.rows:,} scored, {len(problems)} refused")
                if problems or not kept:
                    continue
                probabilities = variant.split(variant.score(rows))[0]
                predicted = variant.labels(probabilities)
                counts[:] += np.bincount(predicted, minlength=len(classes))
                columns = {"image": pa.array([f.name for f in kept], type=pa.string()),
                           "label": pa.array([f.label for f in kept], type=pa.string()),
                           "prediction": pa.array([classes[i] for i in predicted], type=pa.string())}
                columns.update({f"probability_{c}": pa.array(probabilities[:, i].astype(np.float64))
                                for i, c in enumerate(classes)})
                writer.write(pa.table(columns))
                summary.rows += len(kept)
        writer.close()
        if problems:
            write_problems(problems_path, problems)
            shown = "; ".join(f"{name}: {rule} ({message})" for name, rule, message in problems[:SHOWN])
            raise FileRefused(f"{source}: {len(problems)} image(s) the service would refuse, so no predictions were "
                              f"written. First: {shown}. Every one is listed in {problems_path}.")
        if summary.rows == 0:
            raise DataError(f"{source}: no images to score")

    write_atomic(output, write)
    summary.labels = {label: int(n) for label, n in zip(classes, counts)}
    summary.seconds = time.perf_counter() - started
    return summary


def read_one(file: ImageFile, decoder) -> tuple[np.ndarray | None, dict | None, tuple[str, str]]:
    """(pixels at the model's size, logged statistics, ("", "")) or (None, None, (rule, message))."""
    try:
        data = file.read()
    except OSError as exc:
        return None, None, ("readable", str(exc))
    record = inspect_image(file.name, data, decoder.limits, mode=image_shape(decoder.schema).mode,
                           fit=decoder.shape[:2])   # reduced as the service reduces it: the same pixels
    if record.pixels is None:
        return None, None, ("size limit" if record.too_large else "decodable", record.error or "not decodable")
    if min(record.width, record.height) < decoder.min_side:
        return None, None, ("min_side", f"{record.width}x{record.height}: both sides must be at least "
                                        f"{decoder.min_side} pixels")
    shape = decoder.shape
    return fit_size(record.pixels, shape[0], shape[1]), {k: getattr(record, k) for k in ("width", "height")}, ("", "")


def write_problems(path: Path, problems: list[tuple[str, str, str]]) -> None:
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "rule", "message"])
        writer.writerows(problems)
