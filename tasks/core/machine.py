"""The machine a timing was taken on, and how busy it was meanwhile: every latency figure a gate judges is recorded
beside these, so a reader can tell a slow model from a busy box."""
from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() says only `x86_64` on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    """The first CUDA GPU: through torch when this process has loaded it, else from the NVIDIA driver's /proc
    entries (importing torch only to ask would cost bless about 2 s)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    return None


def describe_machine(threads: int) -> dict:
    """What the figures were measured on: CPU, cores, threads used, library versions, GPU when there is one."""
    from importlib.metadata import version

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
            "torch": version("torch"), "onnxruntime": version("onnxruntime"), "numpy": version("numpy"),
            "gpu": gpu_name()}


def cpu_times() -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole machine since boot, in clock ticks; None where /proc/stat is missing."""
    try:
        fields = [float(v) for v in PROC_STAT.read_text().splitlines()[0].split()[1:]]
    except (OSError, IndexError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)   # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def load_during() -> Iterator[dict]:
    """Yields a dict filled on exit with the machine's load over the block: `busy_share` (of all cores' time, every
    process counted), the 1-minute load average and the cores, so a figure can be read against them."""
    load: dict = {}
    before = cpu_times()
    try:
        yield load
    finally:
        after = cpu_times()
        cores = os.cpu_count() or 1
        load.update(cores=cores, load_1m=round(os.getloadavg()[0], 2))
        if before and after and after[1] > before[1]:
            load["busy_share"] = round((after[0] - before[0]) / (after[1] - before[1]), 3)


def describe_load(load: dict) -> str:
    """'load 3.9 on 2 cores, CPU 97% busy' (what `load_during` recorded)."""
    if not load:
        return "load not measured"
    busy = f", CPU {load['busy_share']:.0%} busy" if "busy_share" in load else ""
    return f"load {load['load_1m']:.1f} on {load['cores']} cores{busy}"
