"""Served rows and predictions as JSON lines: the input of the drift monitor."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path


class RequestLog:
    """Appends one line per served row; a no-op when `path` is None (e.g. the canary's service)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lock = threading.Lock()
        self.handle = None

    def open(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.handle = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        with self.lock:
            if self.handle is not None:
                self.handle.close()
                self.handle = None

    def write(self, alias: str, version: str, rows: list[dict], labels: list[str]) -> None:
        if self.path is None:
            return
        stamp = time.time()
        lines = "".join(json.dumps({"ts": stamp, "alias": alias, "version": version, "features": row,
                                    "prediction": label}) + "\n" for row, label in zip(rows, labels))
        with self.lock:  # checked under the lock: a request finishing during shutdown finds it closed, not half
            if self.handle is not None:
                self.handle.write(lines)
                self.handle.flush()
