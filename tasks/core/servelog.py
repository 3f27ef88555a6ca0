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
written on the service's request path, so a few microseconds a row matter); any JSON reader reads them."""
from __future__ import annotations

import time
from pathlib import Path

import orjson

FEEDBACK_FILE = "feedback.jsonl"
SHADOW_FILE = "shadow.jsonl"
ROTATED_GLOB = "-*.jsonl"
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
