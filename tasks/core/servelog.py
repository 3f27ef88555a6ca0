"""The request log's format, in one place: the service writes it (serving/request_log.py), the monitor and
the retrain read it (tasks/monitoring/window.py). Two kinds of JSON lines, in files under `data/serve/`:

- served rows, in `requests.jsonl` (the active file) and `requests-<UTC time>.jsonl` (rotated ones):
  {"ts": <unix seconds>, "id": "<request id>-<row index>", "request_id": ..., "variant": "champion",
   "version": "3", "prediction": "yes", "probabilities": {"no": 0.8, "yes": 0.2}, "features": {...}}
- feedback labels, in `feedback.jsonl` beside them: {"ts": ..., "id": "<row id>", "label": "yes"}
- shadow answers, in `shadow.jsonl` beside them (a canary's shadow: the variant that did not answer scored the
  same row, under the same row id; never returned, and not served traffic, so the monitor never reads them):
  lines like served rows

A row id names one served row; `POST /feedback` and the monitor join on it. Lines are compact JSON (orjson:
written on the service's request path, so a few microseconds a row matter); any JSON reader reads them.

With `serve.ship_to` set, the service ships each closed segment (a rotated file) to the bucket and renames it
`<stem>-<UTC time>.shipped.jsonl` (kept: local readers still see it); in the bucket a segment is
`<prefix>/<kind>/<host>/<UTC time>-<sha256 of its bytes, 16 hex>.jsonl`, kind `requests` or `feedback`. The time
is when the segment was closed, so no row in it is newer; the digest makes a re-ship after a crash land on the same
key (idempotent) and two segments of one host never share a key."""
from __future__ import annotations

import re
import time
from calendar import timegm
from pathlib import Path

import orjson

PREDICTION = "prediction"   # a served row's label, as the log and the monitor's frames name it
LABEL = "label"             # the column a joined feedback label lands in (None where no label came)
FEEDBACK_FILE = "feedback.jsonl"
SHADOW_FILE = "shadow.jsonl"
ROTATED_GLOB = "-*.jsonl"
STAMP = "%Y%m%dT%H%M%SZ"   # UTC, to the second; rotated names sort by time, which served_files() relies on
SHIPPED = ".shipped"       # a local segment already in the bucket: <stem>-<stamp>.shipped.jsonl
SERVED_KIND, FEEDBACK_KIND = "requests", "feedback"   # the bucket's folders (whatever the local file's name)
STAMP_IN_NAME = re.compile(r"(\d{8}T\d{6}Z)(\d*)")   # the stamp, then a counter for a second rotation in a second
LINE = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY   # numpy scalars as numbers, NaN as null


def row_id(request_id: str, index: int) -> str:
    return f"{request_id}-{index}"


def served_bytes(request_id: str, index: int, variant: str, version: str, features: dict, prediction: str,
                 probabilities: dict[str, float], ts: float | None = None) -> bytes:
    """One served row's line, UTF-8 (what the service appends)."""
    return orjson.dumps({"ts": time.time() if ts is None else ts, "id": row_id(request_id, index),
                         "request_id": request_id, "variant": variant, "version": version, "prediction": prediction,
                         "probabilities": probabilities, "features": features}, option=LINE)


def served_line(request_id: str, index: int, variant: str, version: str, features: dict, prediction: str,
                probabilities: dict[str, float], ts: float | None = None) -> str:
    return served_bytes(request_id, index, variant, version, features, prediction, probabilities, ts).decode()


def feedback_line(row: str, label: str, ts: float | None = None) -> str:
    return orjson.dumps({"ts": time.time() if ts is None else ts, "id": row, "label": label},
                        option=LINE).decode()


def feedback_path(request_log: Path) -> Path:
    return request_log.parent / FEEDBACK_FILE


def shadow_path(request_log: Path) -> Path:
    return request_log.parent / SHADOW_FILE


def rotated_path(request_log: Path, stamp: str) -> Path:
    return request_log.with_name(f"{request_log.stem}-{stamp}{request_log.suffix}")


def served_files(request_log: Path) -> list[Path]:
    """Every file of served rows, oldest first: the rotated ones (their names sort by time), then the active one."""
    rotated = sorted(request_log.parent.glob(f"{request_log.stem}{ROTATED_GLOB}"))
    return rotated + ([request_log] if request_log.exists() else [])


def shipped_path(segment: Path) -> Path:
    """Where a local segment goes once it is in the bucket: still matched by served_files(), never shipped again."""
    return segment.with_name(f"{segment.stem}{SHIPPED}{segment.suffix}")


def unshipped_segments(log: Path) -> list[Path]:
    """The closed segments of `log` (rotated files) not yet in the bucket, oldest first."""
    return [path for path in served_files(log) if path != log and not path.stem.endswith(SHIPPED)
            and STAMP_IN_NAME.fullmatch(path.stem.removeprefix(f"{log.stem}-"))]


def newest_possible_ts(name: str) -> float:
    """The unix seconds no row of a segment named with a stamp is newer than: a segment is closed after its last
    row was logged, and the stamp drops the fraction of that second. A name without a stamp (the active file) may
    hold rows up to now."""
    found = STAMP_IN_NAME.search(name)
    return float("inf") if found is None else timegm(time.strptime(found.group(1), STAMP)) + 1.0


def segment_key(prefix: str, kind: str, host: str, stamp: str, digest: str) -> str:
    return "/".join(part for part in (prefix, kind, host, f"{stamp}-{digest}.jsonl") if part)


def stamp_of(segment: Path) -> str:
    """The stamp (and counter) of a rotated file's name: `requests-20261202T001500Z01.jsonl` -> `20261202T001500Z01`."""
    found = STAMP_IN_NAME.search(segment.name)
    if found is None:
        raise ValueError(f"{segment.name} is not a rotated segment (no <UTC time> in its name)")
    return found.group(0)
