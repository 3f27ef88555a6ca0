"""Shared by the benchmarks: machine facts and the result file format."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import torch

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "python": platform.python_version()}


def save(name: str, title: str, figures: dict, baseline: dict, ratio: float, goal: str, met: bool | None,
         notes: str = "") -> Path:
    """bench/results/<name>.json: what was measured, against what, the ratio and the goal."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"name": name, "title": title, "figures": figures, "baseline": baseline, "ratio": round(ratio, 3),
               "goal": goal, "goal_met": met, "notes": notes, "machine": machine(),
               "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload, indent=2))
    return path
