"""Training checkpoints: atomic, hash-verified, weights_only-safe; a damaged one falls back to the previous.

Layout: `<folder>/step-00001234.pt` plus `<folder>/manifest.json`, which lists each checkpoint's sha256
and the run fingerprint (params + data). The manifest is rewritten (atomically) after the file it names,
so a crash between the two leaves a checkpoint the manifest does not vouch for, never the reverse.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from tasks.core.artifacts import read_json, sha256_file, write_atomic, write_json_atomic

log = logging.getLogger("torchship.checkpoint")
KEEP = 2  # the newest and one fallback


def save_checkpoint(folder: Path, step: int, state: dict[str, Any], fingerprint: str) -> Path:
    """Write `state` (tensors and primitives only) for `step`; keep the newest KEEP checkpoints."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:08d}.pt"
    write_atomic(path, lambda tmp: torch.save(state, tmp))
    manifest = _manifest(folder, fingerprint)
    entries = [e for e in manifest["checkpoints"] if e["file"] != path.name]
    entries.append({"file": path.name, "step": step, "sha256": sha256_file(path)})
    entries.sort(key=lambda e: e["step"])
    for stale in entries[:-KEEP]:
        (folder / stale["file"]).unlink(missing_ok=True)
    write_json_atomic(folder / "manifest.json", {"fingerprint": fingerprint, "checkpoints": entries[-KEEP:]})
    return path


def load_latest(folder: Path, fingerprint: str) -> dict[str, Any] | None:
    """The newest checkpoint of this run whose bytes match the manifest; None to start fresh."""
    manifest = _manifest(folder, fingerprint)
    if manifest.get("fingerprint") != fingerprint:
        return None
    for entry in sorted(manifest["checkpoints"], key=lambda e: -e["step"]):
        path = folder / entry["file"]
        if not path.exists() or sha256_file(path) != entry["sha256"]:
            log.warning("checkpoint %s is missing or damaged (hash mismatch); trying the previous one", path)
            continue
        try:
            state = torch.load(path, weights_only=True)
        except Exception as exc:  # truncated or not a checkpoint: never fatal, just not usable
            log.warning("checkpoint %s cannot be read (%s); trying the previous one", path, exc)
            continue
        log.info("resuming from step %d (%s)", entry["step"], path)
        return state
    return None


def clear(folder: Path) -> None:
    """Forget checkpoints of another run (different params or data)."""
    for path in folder.glob("step-*.pt"):
        path.unlink()
    (folder / "manifest.json").unlink(missing_ok=True)


def _manifest(folder: Path, fingerprint: str) -> dict[str, Any]:
    path = folder / "manifest.json"
    try:
        manifest = read_json(path)
    except (FileNotFoundError, ValueError):
        return {"fingerprint": fingerprint, "checkpoints": []}
    return manifest if manifest.get("fingerprint") == fingerprint else {"fingerprint": fingerprint, "checkpoints": []}
