"""A window of served traffic: the newest rows of the request log (by count, optionally by time), with the
feedback labels that name them joined in. Reads the format of tasks/core/servelog.py."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tasks.config import MonitorParams
from tasks.core.errors import TorchshipError
from tasks.core.servelog import feedback_path, served_files
from tasks.monitoring.estimate import PROBABILITIES

LABEL = "label"   # the column a joined feedback label lands in (None where no label came)


@dataclass(frozen=True)
class Window:
    rows: pd.DataFrame          # one row per served row: id, ts, variant, version, prediction, probabilities
                                # ({class: p}, None in logs written before they were logged), label, features...
    features: list[str]
    start: float                # unix seconds of the first and last row
    end: float

    @property
    def labelled(self) -> pd.DataFrame:
        return self.rows[self.rows[LABEL].notna()]

    def versions(self) -> dict[str, int]:
        """Which registered versions served the window, and how many rows each."""
        return {str(k): int(v) for k, v in self.rows["version"].value_counts().items()}

    def describe(self) -> dict:
        return {"rows": len(self.rows), "labelled": len(self.labelled), "start": self.start, "end": self.end,
                "versions": self.versions()}


def read_lines(files: list[Path], limit: int, since: float) -> list[dict]:
    """The newest `limit` records no older than `since`, reading files newest first (a log may hold millions
    of rows; a window needs only its tail)."""
    records: list[dict] = []
    for path in reversed(files):
        lines = path.read_text(encoding="utf-8").splitlines()
        for line in reversed(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:   # a line cut by a crash mid-write: skip it, keep the rest
                continue
            if record.get("ts", 0) < since:
                return records[::-1]
            records.append(record)
            if len(records) >= limit:
                return records[::-1]
    return records[::-1]


def read_feedback(path: Path) -> dict[str, str]:
    """Row id -> label from the feedback file and its rotated ones; a later label for a row replaces an earlier."""
    labels = {}
    for part in served_files(path):
        for line in part.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                labels[str(record["id"])] = str(record["label"])
            except (json.JSONDecodeError, KeyError):
                continue
    return labels


def frame_of(records: list[dict], labels: dict[str, str]) -> pd.DataFrame:
    features = pd.DataFrame.from_records([r["features"] for r in records])
    meta = pd.DataFrame({"id": [r["id"] for r in records], "ts": [r["ts"] for r in records],
                         "variant": [r.get("variant", "") for r in records],
                         "version": [str(r.get("version", "")) for r in records],
                         "prediction": [r.get("prediction") for r in records],
                         PROBABILITIES: [r.get(PROBABILITIES) for r in records]})
    meta[LABEL] = meta["id"].map(labels)
    return pd.concat([meta, features.drop(columns=[c for c in meta.columns if c in features], errors="ignore")],
                     axis=1)


def read_window(request_log: Path, rules: MonitorParams, now: float | None = None,
                since: float | None = None) -> Window:
    """The window the monitor judges (or, with `since`, every row served after it: what a retrain reads);
    refuses an empty one with what to do."""
    if not str(request_log) or str(request_log) == ".":
        raise TorchshipError("serve.request_log is empty, so the service keeps no log to monitor: set it "
                             "(default data/serve/requests.jsonl) and serve traffic first.")
    if since is not None:
        limit = 2**62
    else:
        limit = rules.window_rows
        since = (now or time.time()) - rules.window_minutes * 60 if rules.window_minutes else 0.0
    records = read_lines(served_files(request_log), limit, since)
    if not records:
        raise TorchshipError(f"no served rows in {request_log} (or its rotated files) for the window: start "
                             "`torchship serve` and send traffic, then run the monitor again.")
    rows = frame_of(records, read_feedback(feedback_path(request_log)))
    features = [c for c in rows.columns if c not in {"id", "ts", "variant", "version", "prediction", PROBABILITIES,
                                                     LABEL}]
    return Window(rows=rows, features=features, start=float(rows["ts"].min()), end=float(rows["ts"].max()))
