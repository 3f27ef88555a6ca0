"""`torchship predict`'s step: load the registered version as the service does (serving/batch_scoring.py), then score
the source by the version's modality, as its serving part reads inputs (a table file, a folder or a manifest of
images, ...) in flat memory."""
from __future__ import annotations

from pathlib import Path

from serving.batch_scoring import load_version
from tasks.core.scored_files import CHUNK_ROWS, PredictSummary, file_format
from tasks.modalities import modality_of, serving_part


def run(params, source: Path, output: Path, version: str | None = None, alias: str | None = None,
        chunk_rows: int = CHUNK_ROWS, show_progress: bool = True) -> PredictSummary:
    """Load the version, score the source by its model's modality."""
    file_format(output)   # before the registry: a wrong suffix costs nothing
    variant = load_version(params, version, alias)
    part = serving_part(modality_of(variant.schema).name)
    return part.predict(Path(source), Path(output), variant, params, chunk_rows, show_progress)
