"""The table /predict at this code beside an earlier commit's, in alternating rounds on one machine: did a change to
serving/ cost the hot path anything? One machine's ratio to the minimal app moved between 2.2x and 3.0x from run to
run, so one pair of runs proves nothing; turns do.

`bench/bench_serving.py --tables default --rounds 1` from the earlier tree (a git worktree of that commit, made here
unless given), then from this one, ROUNDS times in turn (the earlier first); each tree on a project its own first
run prepared (`--keep`), reused after (`--project`). Saves bench/results/serving_parent.json: each round's requests/s
and p99 from both, the medians, and both against the minimal FastAPI app of their own round. Goal: this code's
median requests/s at least the earlier code's slowest round (not slower within the rounds' spread).

Run: python bench/bench_serving_parent.py [--parent 17e7994] [--rounds 3] [--seconds 10] [--work DIR]
     [--from-logs DIR] (rebuild the result from the logs of an earlier run of this script)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402


def serve_round(tree: Path, project: Path, prepared: bool, seconds: float, log: Path) -> None:
    """One bench_serving round from `tree` (this venv's Python), its output (with its JSON) in `log`."""
    where = ["--project", f"default={project / 'default'}"] if prepared else ["--keep", str(project)]
    with log.open("w") as handle:
        subprocess.run([sys.executable, "bench/bench_serving.py", "--tables", "default", "--rounds", "1", "--seconds",
                        str(seconds), "--save-as", f"parent-round-{log.stem}", *where], cwd=tree, stdout=handle,
                       stderr=subprocess.STDOUT, check=True, timeout=3600)
    (tree / "bench/results" / f"parent-round-{log.stem}.json").unlink(missing_ok=True)   # the log keeps it


def figures_of(log: Path) -> dict:
    """The payload bench_serving printed last: {"torchship": {...}, "minimal_rps": ..., "measured_at": ...}."""
    text = log.read_text()
    payload = json.loads(text[text.rfind('{\n  "name"'):])
    both = {**payload["figures"], **payload["baseline"]}
    return {"torchship": {k.split(" ", 2)[2]: v for k, v in both.items() if k.startswith("default torchship ")},
            "minimal_rps": both["default minimal requests_per_s"], "measured_at": payload["measured_at"]}


def judged(logs: Path, rounds: int, parent: str) -> None:
    turns = [{"round": i, "parent": figures_of(logs / f"parent{i}.log"), "this": figures_of(logs / f"this{i}.log")}
             for i in range(rounds)]
    this = [t["this"]["torchship"]["requests_per_s"] for t in turns]
    before = [t["parent"]["torchship"]["requests_per_s"] for t in turns]
    figures = {"rounds": turns, "per_round_ratio": [round(a / b, 3) for a, b in zip(this, before)],
               "this_rps_median": statistics.median(this), "parent_rps_median": statistics.median(before),
               "this_p99_us_median": statistics.median(t["this"]["torchship"]["p99_us"] for t in turns),
               "parent_p99_us_median": statistics.median(t["parent"]["torchship"]["p99_us"] for t in turns),
               "this_vs_minimal_median": round(statistics.median(
                   t["this"]["torchship"]["requests_per_s"] / t["this"]["minimal_rps"] for t in turns), 3),
               "parent_vs_minimal_median": round(statistics.median(
                   t["parent"]["torchship"]["requests_per_s"] / t["parent"]["minimal_rps"] for t in turns), 3)}
    save("serving_parent", f"Table /predict: this code vs {parent} (before the hardening), alternating rounds",
         figures, {"commit": parent, "requests_per_s_median": figures["parent_rps_median"]},
         figures["this_rps_median"] / figures["parent_rps_median"],
         "not slower than the parent within the rounds' spread (this code's median requests/s >= the parent's "
         "slowest round)", figures["this_rps_median"] >= min(before),
         notes=f"bench/bench_serving.py --tables default --rounds 1, {rounds} times from each tree in turn (the "
               "parent first), each tree on the project its own first round prepared; wrk closed loop, 2 threads, 32 "
               "connections, one row a request; one machine, nothing else running.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", default="17e7994", help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--work", type=Path, help="a folder for the worktree, projects and logs (kept)")
    parser.add_argument("--from-logs", type=Path, help="only judge the logs an earlier run left in this folder")
    args = parser.parse_args()
    if args.from_logs:
        return judged(args.from_logs, args.rounds, args.parent)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-serving-parent-"))
    tree = work / "parent-tree"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.parent], cwd=ROOT, check=True)
    for i in range(args.rounds):
        serve_round(tree, work / "parent-projects", i > 0, args.seconds, work / f"parent{i}.log")
        serve_round(ROOT, work / "this-projects", i > 0, args.seconds, work / f"this{i}.log")
    judged(work, args.rounds, args.parent)


if __name__ == "__main__":
    main()
