"""The project folder's local state: what `torchship clean` removes."""
from __future__ import annotations

import shutil
from pathlib import Path

from tasks.core import paths
from tasks.stages.stage_list import pipeline_stages, stage_folder

RUNTIME_DATA = (paths.QUARANTINE, paths.SERVE, paths.MONITOR, paths.BATCHES)   # data/batches.dvc is committed: kept
KEPT = {".gitignore", ".gitkeep"}  # written by DVC / committed with the project: the folders stay tracked


def local_state(root: Path, cache: bool = False) -> list[Path]:
    """What exists of: stage outputs, quarantined/served/accepted data, the MLflow store, Prefect's state
    (and the DVC cache when asked) that holds any file; each stage folder and mlflow/ keep their committed marker
    files."""
    candidates = [p for folder in stage_folders(root) for p in sorted((root / folder).glob("*")) if p.name not in KEPT]
    candidates += [root / folder for folder in RUNTIME_DATA]
    candidates += [p for p in sorted((root / "mlflow").glob("*")) if p.name not in KEPT] + [root / ".prefect"]
    if cache:
        candidates.append(root / ".dvc" / "cache")
    return [p for p in candidates if holds_files(p)]


def stage_folders(root: Path) -> list[Path]:
    """data/<stage>/ of each stage the pipeline runs (dvc.yaml's; the source stage writes data/source.json only,
    which clean keeps)."""
    return [stage_folder(stage) for stage in pipeline_stages(root)]


def holds_files(path: Path) -> bool:
    """A file, or a folder with a file somewhere below (every command recreates an empty .prefect/db/)."""
    return path.is_file() or path.is_symlink() or (path.is_dir() and any(p.is_file() for p in path.rglob("*")))


def remove_paths(targets: list[Path]) -> None:
    """Delete files and folders (what `local_state` listed and the user confirmed)."""
    for target in targets:
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink(missing_ok=True)
