"""dvc.yaml, read: the one place it is parsed. tasks/stages/stage_list.py derives every list of steps from it, and
the typed loader (tasks/config.py) asks it which steps there are."""
from __future__ import annotations

from pathlib import Path

DVC_FILE = Path("dvc.yaml")


def read_dvc_file(root: Path = Path(".")) -> dict:
    """dvc.yaml under `root`, as plain dicts."""
    from ruamel.yaml import YAML

    return YAML(typ="safe").load((root / DVC_FILE).read_text()) or {}
