"""Rejected data is kept, never lost: each refusal gets its own folder under data/quarantine/ with the
file and the reason, named so that two refusals never collide."""
from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

from tasks.core import paths


def unique_stamp() -> str:
    """Time plus a random suffix: sortable, and two refusals in one second never share a name."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def quarantine_folder(name: str) -> Path:
    folder = paths.QUARANTINE / f"{unique_stamp()}-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def quarantine_copy(path: Path | None, reason: str, report: dict | None = None) -> Path | None:
    """Keep a copy of a rejected source file with the reason, and the refusal's report (every problem found)
    as report.json when there is one (the user's original stays where it was)."""
    if path is None or not path.exists():
        return None
    folder = quarantine_folder(path.stem)
    shutil.copy2(path, folder / path.name)
    (folder / "reason.txt").write_text(reason + "\n")
    if report is not None:
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return folder


def quarantine_move(path: Path) -> Path:
    """Move a refused batch out of the way (it was handed to torchship to judge); returns its folder."""
    folder = quarantine_folder(path.stem)
    shutil.move(str(path), folder / path.name)
    return folder
