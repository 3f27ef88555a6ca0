"""Where a training job's time goes outside its epochs: marks in seconds since the stage's own process started
(the launcher's imports, torchrun's start, the worker's imports, the process group, loading, training, calibration,
the report), written to metrics.json as `timeline_s`. What follows the last mark (the worker's exit, torchrun's)
is the stage's wall time less it, which only its caller sees (bench/gpu_check.py)."""
from __future__ import annotations

import os
import time

from tasks.core.env import STAGE_STARTED_ENV


def process_started_at(pid: int | str = "self") -> float | None:
    """When a process started, in seconds since the epoch: now less its age, from Linux's /proc (None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])   # field 22: start time, clock ticks after boot
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def stage_started_at() -> float:
    """The stage's start: what the launcher put in the environment, else this process's own start."""
    given = os.environ.get(STAGE_STARTED_ENV)
    return float(given) if given else (process_started_at() or time.time())


class Timeline:
    """Named marks, each in seconds since `origin` (the stage's start)."""

    def __init__(self, origin: float | None = None):
        self.origin = stage_started_at() if origin is None else origin
        self.marks: dict[str, float] = {}
        started = process_started_at()
        if started is not None:
            self.marks["worker_started"] = round(max(0.0, started - self.origin), 2)

    def mark(self, name: str) -> None:
        self.marks[name] = round(time.time() - self.origin, 2)

    def seconds(self) -> dict[str, float]:
        return dict(self.marks)
