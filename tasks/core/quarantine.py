"""Rejected data is kept, never lost: each refusal gets its own folder under data/quarantine/ with the
file and the reason, named so that two refusals never collide."""
from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path

from tasks.core import paths


def unique_stamp() -> str:
    """Time plus a random suffix: sortable, and two refusals in one second never share a name."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def safe_name(text: str, fallback: str = "batch") -> str:
    """One folder or file name from user text (a batch's file name): letters, digits, `.`, `_` and `-` only, no
    leading dot, at most 80 characters, so it can never name another folder."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).lstrip(".")[:80]
    return name or fallback


def quarantine_folder(name: str) -> Path:
    """A new folder under data/quarantine/, named by the time and `name` (made safe)."""
    folder = paths.QUARANTINE / f"{unique_stamp()}-{safe_name(name)}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class OutsideFolder(ValueError):
    """A path built from user text would leave the folder it must stay in."""


def contained_path(folder: Path, name: str) -> Path:
    """Where a file named by user text (a manifest's path, an image's name) is kept under `folder`: the text as a
    relative path without its root and `.` parts, each `..` part kept as a plain `__` folder (`../../dvc.yaml` ->
    `__/__/dvc.yaml`, `/etc/x` -> `etc/x`: two names stay two files), then proven to resolve under `folder`
    (OutsideFolder otherwise, e.g. through a symlink already there)."""
    if "\0" in name:
        raise OutsideFolder(f"{name!r} holds a NUL byte: not a file name")
    parts = ["__" if part == ".." else part for part in name.split("/") if part not in ("", ".")]
    path = folder.joinpath(*parts) if parts else folder / "unnamed"
    inside = path.resolve()
    if not inside.is_relative_to(folder.resolve()) or inside == folder.resolve():
        raise OutsideFolder(f"{name!r} does not stay under {folder}")
    return path


def quarantine_copy(path: Path | None, reason: str, report: dict | None = None) -> Path | None:
    """Keep a copy of a rejected source file with the reason, and the refusal's report (every problem found)
    as report.json when there is one (the user's original stays where it was)."""
    if path is None or not path.exists():
        return None
    folder = quarantine_folder(path.stem)
    shutil.copy2(path, contained_path(folder, path.name))
    (folder / "reason.txt").write_text(reason + "\n")
    if report is not None:
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return folder


def quarantine_move(path: Path) -> Path:
    """Move a refused batch out of the way (it was handed to torchship to judge); returns its folder."""
    folder = quarantine_folder(path.stem)
    shutil.move(str(path), contained_path(folder, path.name))
    return folder
