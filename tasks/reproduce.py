"""Asking DVC what would run and why, and running one stage through `dvc repro` so DVC decides
skip-or-run from its hashes and records dvc.lock."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from tasks import layout
from tasks.artifacts import read_json
from tasks.errors import TorchshipError

DVC_STAGES = ("prepare", "validate", "train", "export", "compress", "profile")


class StageFailed(TorchshipError):
    """A DVC stage exited non-zero; the message is the stage's own."""


class StageOutcome(BaseModel):
    stage: str
    status: str          # ran | skipped
    reason: str
    seconds: float
    headline: str = ""


def dvc_command() -> list[str]:
    """The dvc of this interpreter's environment (works without an activated venv)."""
    return [sys.executable, "-m", "dvc"]


def stage_changes(stage: str | None = None, cwd: Path = Path(".")) -> dict[str, list[str]]:
    """`dvc status` as {stage: [why it would run, ...]}; an empty dict means up to date."""
    command = dvc_command() + ["status", "--json"] + ([stage] if stage else [])
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise StageFailed(f"dvc status failed: {result.stderr.strip() or result.stdout.strip()}")
    text = result.stdout.strip()
    raw = json.loads(text[text.index("{"):]) if "{" in text else {}
    return {name: _describe(entries) for name, entries in raw.items() if ":" not in name or name.endswith(".dvc")}


def _describe(entries: list) -> list[str]:
    reasons = []
    for entry in entries:
        if isinstance(entry, str):
            reasons.append(entry)
            continue
        for kind, changes in entry.items():
            if isinstance(changes, dict):
                reasons += [f"{kind.replace('changed ', '')} {path}: {what}" if isinstance(what, str)
                            else f"{kind.replace('changed ', '')} {path} changed" for path, what in changes.items()]
            else:
                reasons.append(f"{kind}: {changes}")
    return reasons or ["changed"]


def headline(stage: str) -> str:
    path = layout.STAGE_METRICS.get(stage)
    if path is None or not Path(path).exists():
        return ""
    return str(read_json(path).get("headline", ""))


def reproduce(stage: str, env: dict[str, str] | None = None, echo=sys.stdout) -> StageOutcome:
    """Run `dvc repro -s <stage>` if DVC says it changed; the stage's own error becomes StageFailed."""
    started = time.perf_counter()
    changes = stage_changes(stage).get(stage)
    if not changes:
        return StageOutcome(stage=stage, status="skipped", reason="deps, params and outs unchanged",
                            seconds=time.perf_counter() - started, headline=headline(stage))
    process = subprocess.Popen(dvc_command() + ["repro", "--single-item", stage], env={**os.environ, **(env or {})},
                               stdout=None, stderr=subprocess.PIPE, text=True)
    tail: collections.deque[str] = collections.deque(maxlen=60)
    reader = threading.Thread(target=_tee, args=(process.stderr, tail, echo), daemon=True)
    reader.start()
    code = process.wait()
    reader.join()
    if code != 0:
        raise StageFailed(_stage_error(stage, list(tail), code))
    return StageOutcome(stage=stage, status="ran", reason="; ".join(changes)[:300],
                        seconds=time.perf_counter() - started, headline=headline(stage))


def _tee(stream, tail: collections.deque, echo) -> None:
    for line in stream:
        tail.append(line.rstrip("\n"))
        echo.write(line)
        echo.flush()


def _stage_error(stage: str, lines: list[str], code: int) -> str:
    """The stage's own one-paragraph message if it printed one, else DVC's error lines."""
    marker = f"torchship {stage} failed:"
    own = [line for line in lines if line.startswith("torchship ") and " failed: " in line]
    if own:  # the first one is the root cause (torchrun's launcher reports after its worker)
        return own[0].replace(marker, f"stage '{stage}' failed:", 1).strip()
    errors = [line for line in lines if line.startswith("ERROR")] or lines[-5:]
    return f"stage '{stage}' failed (exit {code}): " + " ".join(e.strip() for e in errors)
