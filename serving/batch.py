"""`torchship predict`'s step: load the registered version as the service does, then score a table file
(serving/batch_scoring.py) or, for an image model, a folder or a manifest of images (serving/batch_images.py)."""
from __future__ import annotations

from pathlib import Path

from serving.batch_images import predict_images
from serving.batch_scoring import CHUNK_ROWS, PredictSummary, file_format, load_version, predict_file
from tasks.core.errors import DataError

MAX_IMAGE_CHUNK = 1024   # images scored at once at most (a chunk of rows is far smaller in memory)


def run(params, source: Path, output: Path, version: str | None = None, alias: str | None = None,
        chunk_rows: int = CHUNK_ROWS, show_progress: bool = True) -> PredictSummary:
    """Load the version, score the source by its model's modality."""
    file_format(output)   # before the registry: a wrong suffix costs nothing
    if not Path(source).is_dir():
        file_format(source)
    variant = load_version(params, version, alias)
    if variant.schema.is_image:
        return predict_images(source, output, variant, params.images.path_column, params.data.target,
                              min(chunk_rows, MAX_IMAGE_CHUNK), show_progress)
    if Path(source).is_dir():
        raise DataError(f"{source} is a folder, and v{variant.version} scores rows of a table: give a .csv or "
                        ".parquet file")
    return predict_file(source, output, variant, chunk_rows, show_progress)
