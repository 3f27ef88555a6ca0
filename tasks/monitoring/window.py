"""A window of served traffic: the newest rows of the request log (by count, optionally by time), with the
feedback labels that name them joined in. Reads the format of tasks/core/servelog.py, from this host's files or from
every host's segments in the bucket (tasks/monitoring/segments.py): one reader for both."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tasks.core.errors import TorchshipError
from tasks.core.params_spec import MonitorParams
from tasks.core.servelog import LABEL
from tasks.monitoring.estimate import PROBABILITIES
from tasks.monitoring.segments import LogSource, Segment, local_source

CLOCK_SKEW_S = 600.0   # how far two serving hosts' clocks may disagree before a label could be missed


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


def newest_records(segment: Segment, limit: int, since: float) -> list[dict]:
    """The newest `limit` records of one segment no older than `since`, in the segment's order (its lines are in
    time order, so its tail is all a window needs of it; rows of one request share their time)."""
    records: list[dict] = []
    for line in reversed(segment.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:   # a line cut by a crash mid-write: skip it, keep the rest
            continue
        if record.get("ts", 0) < since or len(records) >= limit:
            break
        records.append(record)
    return records[::-1]


def read_lines(segments: list[Segment], limit: int, since: float) -> list[dict]:
    """The newest `limit` records no older than `since`, oldest first. Segments are read newest first and only
    while one could still hold a record newer than those kept (a log may hold millions of rows; a window needs
    only its tail); several hosts' segments overlap in time, so the records are merged by their time."""
    kept: list[dict] = []
    for segment in sorted(segments, key=lambda segment: segment.newest, reverse=True):
        if segment.newest < since or (len(kept) >= limit and segment.newest < kept[0].get("ts", 0)):
            break
        older = newest_records(segment, limit, since)   # before the kept ones: a stable sort keeps ties in order
        kept = sorted(older + kept, key=lambda record: record.get("ts", 0))[-limit:]
    return kept


def read_feedback(segments: list[Segment]) -> dict[str, str]:
    """Row id -> label from every feedback segment; a later label for a row replaces an earlier."""
    labels = {}
    for part in segments:
        for line in part.read_text().splitlines():
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


def read_window(source: LogSource | Path, rules: MonitorParams, now: float | None = None,
                since: float | None = None) -> Window:
    """The window the monitor judges (or, with `since`, every row served after it: what a retrain reads) from
    `source` (a path: that request log on this host); refuses an empty one with what to do."""
    if isinstance(source, Path):
        if not str(source) or str(source) == ".":
            raise TorchshipError("serve.request_log is empty, so the service keeps no log to monitor: set it "
                                 "(default data/serve/requests.jsonl) and serve traffic first.")
        source = local_source(source)
    if since is not None:
        limit = 2**62
    else:
        limit = rules.window_rows
        since = (now or time.time()) - rules.window_minutes * 60 if rules.window_minutes else 0.0
    records = read_lines(source.served(), limit, since)
    if not records:
        raise TorchshipError(f"no served rows in {source.where} (or its rotated files) for the window: start "
                             "`torchship serve` and send traffic, then run the monitor again.")
    # A label comes after its row was served: feedback segments closed before the window began hold none of its
    # labels (with a margin for the clocks of several hosts), so a long-running deployment's older ones stay unread.
    oldest = min(record.get("ts", 0) for record in records) - CLOCK_SKEW_S
    rows = frame_of(records, read_feedback([part for part in source.feedback() if part.newest >= oldest]))
    features = [c for c in rows.columns if c not in {"id", "ts", "variant", "version", "prediction", PROBABILITIES,
                                                     LABEL}]
    return Window(rows=rows, features=features, start=float(rows["ts"].min()), end=float(rows["ts"].max()))
