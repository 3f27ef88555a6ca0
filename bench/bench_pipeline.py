"""The pipeline's own time, as a newcomer meets it: `make pipeline` on a fresh clone, then again unchanged.

The current checkout's commit is cloned (`git clone`; uncommitted changes are not in it, and the JSON records the
commit and whether the tree was dirty) into a temporary folder, where `make pipeline` runs twice: first on the
fresh clone (the venv created and torchship installed, then every stage), then again with nothing changed (DVC
skips every stage; bless finds the champion's own file and passes it unjudged, register reuses its version, and
the canary has nothing to do). `--reuse-venv PATH` links an
installed venv into the clone and tells make not to rebuild it (`make -o .venv/.installed`), with the clone's
code first on PYTHONPATH: the first run then excludes the install, and the JSON says so (`install_included`).
Also recorded: the time inside the flow (the summary table's title), both runs' printed summaries (shown in
docs/getting-started.md), the disk the clone holds afterwards (a linked venv not counted) and the largest
process's peak RSS.

The baseline is the first run: ratio = re-run / first run. Goal: an unchanged re-run takes <= 0.25x the first.
Run: python bench/bench_pipeline.py [--reuse-venv .venv] [--keep DIR] [--dry-run]
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402

GOAL_RATIO = 0.25
FLOW_SECONDS = re.compile(r"torchship pipeline · .+? · (\d+(?:\.\d+)?)s")


@dataclass(frozen=True)
class Step:
    """One command of the benchmark, run in `cwd`."""

    label: str
    argv: list[str]
    cwd: Path


def plan_steps(source: Path, clone: Path, reuse_venv: Path | None) -> list[Step]:
    """Clone, (link the venv), `make pipeline`, `make pipeline` again: what the benchmark runs, in order."""
    make = ["make", "-o", ".venv/.installed", "pipeline"] if reuse_venv else ["make", "pipeline"]
    steps = [Step("clone", ["git", "clone", "--quiet", "--no-hardlinks", str(source), str(clone)], source)]
    if reuse_venv:
        steps.append(Step("link venv", ["ln", "-s", str(reuse_venv.resolve()), str(clone / ".venv")], clone))
    return steps + [Step("first run", make, clone), Step("re-run", make, clone)]


def clone_env(clone: Path, reuse_venv: Path | None) -> dict[str, str]:
    """A user's shell: no test or tracking settings inherited; a reused venv imports the clone's code first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    return {**env, "PYTHONPATH": str(clone)} if reuse_venv else env


def disk_mib(folder: Path) -> float:
    """Bytes under `folder` (links not followed), in MiB."""
    total = sum(p.lstat().st_size for p in folder.rglob("*") if not p.is_symlink() and p.is_file())
    return total / 2**20


def run_step(step: Step, env: dict[str, str]) -> tuple[float, str]:
    """Run one step; its wall seconds and its console output. A failure stops the benchmark with the output's tail."""
    started = time.perf_counter()
    done = subprocess.run(step.argv, cwd=step.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{step.label} failed ({' '.join(step.argv)}, exit {done.returncode}):\n{done.stdout[-4000:]}")
    print(f"{step.label}: {seconds:.1f} s")
    return seconds, done.stdout


def flow_seconds(output: str) -> float | None:
    """The time the summary table's title gives (inside the flow), if the output has one."""
    found = FLOW_SECONDS.findall(output)
    return float(found[-1]) if found else None


def summary_text(output: str, most_lines: int = 80) -> str:
    """The console's summary, from the table's title to the end (what getting-started.md shows), or ''."""
    lines = output.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if FLOW_SECONDS.search(line)]
    return "\n".join(line.rstrip() for line in lines[starts[-1]:][:most_lines]) if starts else ""


def git_state(source: Path) -> tuple[str, bool]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=source, capture_output=True, text=True).stdout)
    return commit, dirty


def pipeline_figures(seconds: dict[str, float], outputs: dict[str, str], install_included: bool, disk: float,
                     peak_mib: float, commit: str, dirty: bool) -> dict:
    """The figures of bench/results/pipeline.json from the two runs' wall times and console output."""
    return {"first_run_s": round(seconds["first run"], 1), "rerun_s": round(seconds["re-run"], 1),
            "install_included": install_included, "first_flow_s": flow_seconds(outputs["first run"]),
            "rerun_flow_s": flow_seconds(outputs["re-run"]), "disk_mib": round(disk, 1),
            "venv_counted_in_disk": install_included, "peak_rss_mib": round(peak_mib, 1), "commit": commit[:12],
            "uncommitted_changes": dirty, "first_summary": summary_text(outputs["first run"]),
            "rerun_summary": summary_text(outputs["re-run"])}


def measure(clone: Path, reuse_venv: Path | None) -> None:
    """Run the plan in `clone` and save bench/results/pipeline.json."""
    env = clone_env(clone, reuse_venv)
    seconds, outputs = {}, {}
    for step in plan_steps(ROOT, clone, reuse_venv):
        seconds[step.label], outputs[step.label] = run_step(step, env)
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    figures = pipeline_figures(seconds, outputs, reuse_venv is None, disk_mib(clone), peak_mib, *git_state(ROOT))
    ratio = figures["rerun_s"] / figures["first_run_s"]
    notes = ("`git clone` of the checkout's commit into a temporary folder, then `make pipeline` twice there, timed "
             "by wall clock (the first on the fresh clone, the second with nothing changed); "
             + ("the first run includes creating .venv and installing torchship. " if reuse_venv is None else
                "an installed venv was linked in (`--reuse-venv`), so the first run excludes the install and the disk "
                "figure excludes the venv. ")
             + "Baseline = the first run; ratio = re-run / first run. *_flow_s = the summary table's own time "
             "(inside the flow, without Prefect's start). peak_rss_mib = the largest process's peak RSS "
             "(getrusage of the children).")
    save("pipeline", "make pipeline on a fresh clone, then again with nothing changed", figures,
         {"first_run_s": figures["first_run_s"]}, ratio, f"an unchanged re-run takes <= {GOAL_RATIO}x the first run",
         ratio <= GOAL_RATIO, notes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse-venv", type=Path, help="An installed venv to link into the clone (skips the install).")
    parser.add_argument("--keep", type=Path, help="Clone into this (new) folder and keep it, instead of a temp folder.")
    parser.add_argument("--dry-run", action="store_true", help="Print the commands it would run; run nothing.")
    args = parser.parse_args(argv)
    if args.reuse_venv and not (args.reuse_venv / "bin" / "torchship").exists():
        parser.error(f"--reuse-venv {args.reuse_venv}: no bin/torchship there (not an installed torchship venv)")
    if args.dry_run:
        clone = args.keep or Path(tempfile.gettempdir(), "torchship-bench-pipeline-<temp>", "torchship")
        for step in plan_steps(ROOT, clone, args.reuse_venv):
            print(f"{step.label}: (cd {step.cwd} && {' '.join(step.argv)})")
        return
    clone = args.keep or Path(tempfile.mkdtemp(prefix="torchship-bench-pipeline-")) / "torchship"
    try:
        measure(clone, args.reuse_venv)
    finally:
        if not args.keep:
            shutil.rmtree(clone.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
