"""Pipeline time on the team stack against the embedded default, side by side, and the stack's memory meanwhile.

The same `torchship run` of the same params runs in fresh copies of this working tree (tests.conftest.make_project:
git-tracked files, committed, as a clone): one on the embedded default (MLflow on SQLite in the project, artifacts
in a local folder, the DVC remote folder `.dvc-remote/`, an ephemeral Prefect API in the run's process), one on
`torchship stack up` (an `mlflow server` on PostgreSQL with basic auth and artifacts proxied to moto's S3, the DVC
remote in the bucket, the flow run reported to the stack's Prefect server with its auth string), set up only by
what `torchship stack env` prints. Runs go embedded, stack, stack, embedded (ABBA) so that a drift of the
machine's load weighs on both sides; each side's figure is the mean of its runs. While the stack side runs, the
RSS of every part (as `torchship stack status` reads it: a process with its children) is sampled; the peaks are
reported.

Data: the synthetic default at `--rows` rows (20,000 by default, a fifth of params.yaml's, so that four runs fit
a session on 2 cores): the servers' overhead is per call, not per row, so a smaller table gives the stack a
larger share of the time: a conservative ratio for the default's 100,000 rows.

Goal: stack <= 1.3x embedded. Run: python bench/bench_team_pipeline.py [--rows 20000] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402
from flows.cli.stack.lifecycle import shell_env, stack_down, stack_status  # noqa: E402
from flows.cli.stack.servers import BUCKET  # noqa: E402
from flows.cli.stack.state import StackPaths  # noqa: E402
from tasks.core.env import STACK_DIR_ENV  # noqa: E402
from tasks.core.procs import sigterm_raises  # noqa: E402
from tests.helpers.stack import evaluated  # noqa: E402  (what `eval "$(torchship stack env)"` exports)

GOAL_RATIO = 1.3
BIN = Path(sys.executable).parent
SAMPLE_S = 2.0
FLOW_SECONDS = re.compile(r"torchship pipeline · .+? · (\d+(?:\.\d+)?)s")
STEP_SECONDS = re.compile(r"^│ (\w+)\s+│[^│]+│ *(\d+(?:\.\d+)?)s *│", re.M)   # the summary table's rows


class PeakRss:
    """Samples every stack part's RSS every SAMPLE_S seconds in a thread while in use; `peaks` holds the largest."""

    def __init__(self, paths: StackPaths):
        self.paths, self.peaks, self.stopped = paths, {}, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            for row in stack_status(self.paths):
                self.peaks[row.name] = max(self.peaks.get(row.name, 0.0), round(row.rss_mib))

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


def run_pipeline(folder: Path, rows: int, stack_env: dict[str, str] | None) -> dict:
    """One `torchship run` in a fresh project copy; on the stack when `stack_env` is given."""
    from tests.conftest import make_project

    project = make_project(folder, {"data": {"rows": rows}}, tiny=False)
    sets: list[str] = []
    env = project.env()
    if stack_env is not None:
        tracking = re.search(r"--set tracking\.uri=(\S+)", stack_env["__lines__"]).group(1)
        sets = ["--set", f"tracking.uri={tracking}", "--set", "tracking.artifacts=null"]
        env.update({k: v for k, v in stack_env.items() if k != "__lines__"})
        # a DVC remote of its own per run: the team topology restores a stage from the remote's run cache when an
        # earlier run finished it (tasks/stages/run_cache.py), which would spare the second stack run work
        for command in (["dvc", "remote", "add", "-d", "-f", "stack", f"s3://{BUCKET}/dvc-{folder.name}"],
                        ["git", "commit", "-qam", "DVC remote: the team's bucket"]):
            subprocess.run(command, cwd=project.root, env=env, check=True, capture_output=True, timeout=60)
    began = time.perf_counter()
    done = project.torchship("run", *sets, timeout=3600, env=env)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"`torchship run` failed in {folder} (exit {done.returncode}):\n"
                         f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    flow = FLOW_SECONDS.search(done.stdout)
    return {"wall_s": round(seconds, 1), "flow_s": float(flow.group(1)) if flow else None,
            "load_1m_at_end": round(os.getloadavg()[0], 1),
            "steps_s": {step: float(value) for step, value in STEP_SECONDS.findall(done.stdout)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--keep", type=Path, help="keep the projects here (default: a removed temp folder)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="torchship-team-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    # not under a 0700 temp folder: PostgreSQL runs as another user and must traverse the path
    paths = StackPaths(Path(tempfile.mkdtemp(prefix="torchship-stack-bench-", dir="/tmp")))
    paths.root.chmod(0o711)
    runs: dict[str, list[dict]] = {"embedded": [], "stack": []}
    with sigterm_raises():   # a stopped bench still takes its stack down (the finally below)
        try:
            began = time.monotonic()
            up = subprocess.run([str(BIN / "torchship"), "stack", "up", "--workers", "1"], cwd=ROOT, text=True,
                                capture_output=True, timeout=600, env={**os.environ, STACK_DIR_ENV: str(paths.root)})
            if up.returncode != 0:   # e.g. Debian's postgresql or moto missing: `make stack-deps`
                raise SystemExit(f"`torchship stack up` failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}")
            up_s = round(time.monotonic() - began, 1)
            lines = shell_env(paths)
            stack_env = {**evaluated(lines), "__lines__": lines}
            with PeakRss(paths) as rss:
                for i, side in enumerate(("embedded", "stack", "stack", "embedded")):
                    figures = run_pipeline(work / f"{i}-{side}", args.rows, stack_env if side == "stack" else None)
                    runs[side].append(figures)
                    print(f"{side}: {figures}", flush=True)
        finally:
            stack_down(paths, os.environ)
            shutil.rmtree(paths.root, ignore_errors=True)
            if args.keep is None:
                shutil.rmtree(work, ignore_errors=True)
    embedded = statistics.mean(r["wall_s"] for r in runs["embedded"])
    stack = statistics.mean(r["wall_s"] for r in runs["stack"])
    ratio = stack / embedded
    figures = {"rows": args.rows, "stack_wall_s": round(stack, 1), "embedded_wall_s": round(embedded, 1),
               "stack_up_s": up_s, "peak_rss_mib": rss.peaks, "peak_rss_total_mib": sum(rss.peaks.values()),
               "steps_s": {side: {step: round(statistics.mean(r["steps_s"].get(step, 0.0) for r in side_runs), 1)
                                  for step in side_runs[0]["steps_s"]} for side, side_runs in runs.items()},
               "runs": runs}
    save("team_pipeline", f"`torchship run` on the team stack vs the embedded default ({args.rows:,} rows)",
         figures, {"embedded_wall_s": round(embedded, 1)}, ratio, f"stack <= {GOAL_RATIO}x embedded",
         ratio <= GOAL_RATIO,
         notes="the same params in fresh project copies, runs ordered embedded, stack, stack, embedded (each side "
               "the mean of its two); the stack side set up only by `torchship stack env` (MLflow server on "
               "PostgreSQL with basic auth, artifacts and the DVC remote in moto's S3, the flow run on the stack's "
               "Prefect server); peak RSS per part sampled every 2 s through the four runs (a process with its "
               "children; PostgreSQL's shared buffers count in each of its processes).")


if __name__ == "__main__":
    main()
