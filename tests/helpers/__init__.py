"""Helpers the tests share: a free port, and a snapshot of the files and registry a failure must not touch."""
from __future__ import annotations

import hashlib

from tasks.core.procs import free_port

GUARDED_FILES = ("params.yaml", "data/prepare/train.parquet", "data/train/model.pt", "data/export/model.onnx")


def snapshot(project, model: str, files: tuple[str, ...] = GUARDED_FILES) -> tuple[dict, dict]:
    """sha256 of the last good artifacts and the registry as another process sees it."""
    hashes = {f: hashlib.sha256((project.root / f).read_bytes()).hexdigest() for f in files}
    return hashes, project.registry(model)


__all__ = ["GUARDED_FILES", "free_port", "snapshot"]
