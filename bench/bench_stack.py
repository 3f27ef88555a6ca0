"""The team stack (`torchship stack`): how long `up` takes, first (initdb, both servers' migrations) and again
after `down` (data kept), and the resident memory of each part while it idles, as `torchship stack status` reads
it (each process with its children; PostgreSQL's shared buffers count in each of its processes, so its figure
is an upper bound), and as PSS, which counts shared pages once.

Each step runs the real CLI in a throwaway state folder under /tmp (PostgreSQL, running as another user, must
traverse it), with the load average of the machine recorded beside the times: on a shared 2-core box they move
with it. Goal: a first `up` within 60 s on 2 cores.

Run: python bench/bench_stack.py [--workers 1]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402
from flows.cli.stack.lifecycle import stack_down, stack_status  # noqa: E402
from flows.cli.stack.state import StackPaths  # noqa: E402
from tasks.core.env import STACK_DIR_ENV  # noqa: E402

GOAL_FIRST_UP_S = 60.0
IDLE_S = 10   # the servers settle (Prefect's services start their loops) before memory is read


def tree_pss_mib(pid: int) -> float:
    """Proportional memory of a process and its descendants: shared pages split among their users, so a sum over
    the parts counts PostgreSQL's shared buffers once."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)]) / 2**20


def timed_stack(paths: StackPaths, *args: str) -> float:
    began = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "torchship"), "stack", *args], cwd=ROOT, check=True,
                   env={**os.environ, STACK_DIR_ENV: str(paths.root)}, capture_output=True, timeout=600)
    return round(time.monotonic() - began, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    paths = StackPaths(Path(tempfile.mkdtemp(prefix="torchship-stack-bench-", dir="/tmp")))
    paths.root.chmod(0o711)
    try:
        load_before = os.getloadavg()[0]
        first_up = timed_stack(paths, "up", "--workers", str(args.workers))
        time.sleep(IDLE_S)
        rows = stack_status(paths)
        rss = {row.name: round(row.rss_mib) for row in rows}
        pss = {row.name: round(tree_pss_mib(row.pid)) for row in rows if row.pid}
        down = timed_stack(paths, "down")
        up_again = timed_stack(paths, "up", "--workers", str(args.workers))
    finally:
        stack_down(paths, os.environ)
        shutil.rmtree(paths.root, ignore_errors=True)
    figures = {"first_up_s": first_up, "up_again_s": up_again, "down_s": down, "workers": args.workers,
               "total_rss_mib": sum(rss.values()), "load_average_at_start": round(load_before, 1),
               "total_pss_mib": sum(pss.values()), "rss_mib": rss, "pss_mib": pss}
    save("stack", f"`torchship stack up --workers {args.workers}`: first up, down, up again; RSS of each part",
         figures, {"first_up_s": first_up}, up_again / first_up, f"first up <= {GOAL_FIRST_UP_S:.0f} s on 2 cores",
         first_up <= GOAL_FIRST_UP_S,
         notes="the real CLI in a throwaway state folder; RSS read by `stack status` (a process with its children) "
               f"after {IDLE_S} s idle, and PSS (shared pages split among their users); the ratio is up-again over "
               "first up (no initdb, no migrations).")


if __name__ == "__main__":
    main()
