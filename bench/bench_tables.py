"""Tables: the served variant's holdout accuracy and macro-F1 beside the scikit-learn baselines (logistic
regression, histogram gradient boosting) on the same split, for the default data and four public tables that
ship inside installed packages, mean over seeds, with the pipeline's wall time per table.

Each table and seed is one real `torchship run` (the venv's CLI, an ephemeral Prefect API) in a throwaway clone of
this working tree (tests.conftest.make_project: its own DVC and MLflow state) at params.yaml's defaults; only
data.source / data.target and the seeds are set. Seed i sets prepare.seed (the split) and train.seed to
params.yaml's prepare.seed + i (42, 43, ...), so seed 0 is the default run and the baselines always see the
candidate's split. Read back from the project's files: data/profile/report.json (the selected variant, which
register publishes and the service runs, and its holdout scores), data/baseline/report.json (the baselines on that
holdout), data/prepare/metrics.json (the table's shape), and the pipeline's MLflow artifacts bless.json (the gate's
verdict; its candidate scores must equal profile's) and summary.md (seconds per step).

Goal: the served variant within 1 point of the best baseline (per metric, on the means) on every table.

The penguins table needs the bench extra (`pip install -e '.[bench]'`, or `make bench-tables`); it is read from
the CSV the package ships, no download. Run:
    python bench/bench_tables.py [--tables default,digits,breast_cancer,wine,penguins] [--seeds 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402
from tasks.config import load_params  # noqa: E402
from tasks.core import paths  # noqa: E402
from tasks.ops.lineage import git_state  # noqa: E402

METRICS = ("accuracy", "f1_macro")
BASELINES = ("logistic_regression", "hist_gradient_boosting")
GOAL_POINTS = 1.0           # the served variant may trail the best baseline by at most this, per metric
PENGUINS_CSV = "penguins.csv"
FULL_SEEDS = 3


@dataclass(frozen=True)
class Table:
    name: str
    about: str
    sets: tuple[str, ...] = ()        # --set overrides besides the seeds
    write_file: bool = False          # the table is a CSV the bench writes into the project first


TABLES = {t.name: t for t in (
    Table("default", "params.yaml as it is (synthetic churn: mixed types, missing values)"),
    Table("digits", "scikit-learn digits (numeric)", ("data.source=sklearn:digits",)),
    Table("breast_cancer", "scikit-learn breast cancer (numeric)", ("data.source=sklearn:breast_cancer",)),
    Table("wine", "scikit-learn wine (numeric)", ("data.source=sklearn:wine",)),
    Table("penguins", "palmerpenguins penguins.csv (island, sex categorical; missing values)",
          (f"data.source={PENGUINS_CSV}", "data.target=species"), write_file=True),
)}


def write_penguins(root: Path) -> None:
    """The CSV palmerpenguins ships (read from the installed package, never downloaded), as the project's source."""
    from palmerpenguins import load_penguins

    load_penguins().to_csv(root / PENGUINS_CSV, index=False)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def scores(figures: dict) -> dict[str, float]:
    return {metric: float(figures[metric]) for metric in METRICS}


def newest(root: Path, name: str) -> Path | None:
    """The newest MLflow artifact of that name in the project (one pipeline run per project)."""
    found = sorted((root / "mlflow").rglob(name), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def step_seconds(summary: Path | None) -> dict[str, float]:
    """{step: seconds} from the pipeline's summary.md table rows (`| step | status | 1.2s | headline |`)."""
    if summary is None:
        return {}
    rows = re.findall(r"^\| ([\w-]+) \| [^|]+ \| ([\d.]+)s \|", summary.read_text(), flags=re.M)
    return {step: float(seconds) for step, seconds in rows}


def read_outcome(root: Path) -> dict:
    """What one finished run measured, from the project's files."""
    profile = read_json(root / paths.PROFILE_REPORT)
    selected = profile["selected"]
    baselines = read_json(root / paths.BASELINE_REPORT)["models"]
    prepared = read_json(root / paths.PREPARE_METRICS)
    outcome = {"served_variant": selected, "served": scores(profile["variants"][selected]),
               "teacher": scores(profile["variants"]["eager-fp32"]),
               **{name: scores(baselines[name]) for name in BASELINES},
               "rows": prepared["rows"], "features": prepared["features"], "classes": prepared["classes"],
               "train_headline": read_json(root / paths.TRAIN_METRICS).get("headline", ""),
               "steps_s": step_seconds(newest(root, "summary.md"))}
    return outcome | read_blessing(newest(root, "bless.json"), outcome["served"])


def read_blessing(path: Path | None, served: dict[str, float]) -> dict:
    """The bless gate's status (and its reasons when it did not pass); its candidate scores must equal profile's:
    bless re-scores the published ONNX file on the same holdout."""
    if path is None:
        return {"bless": "no bless.json found"}
    blessing = read_json(path)
    gate = blessing.get("gate", {})
    found = {"bless": gate.get("status", "unknown")}
    if found["bless"] != "pass":
        found["bless_reasons"] = gate.get("reasons", [])
    candidate = blessing.get("candidate_metrics", {})
    differs = {m: candidate[m] for m in METRICS if m in candidate and abs(candidate[m] - served[m]) > 1e-6}
    if differs:
        found["bless_scores_differ"] = differs
    return found


def run_once(table: Table, seed: int, folder: Path, timeout: float) -> dict:
    """One `torchship run` of `table` at `seed` in a fresh project copy; its wall clock and outcome."""
    from tests.conftest import make_project

    project = make_project(folder, tiny=False)
    if table.write_file:
        write_penguins(project.root)
    sets = [*table.sets, f"prepare.seed={seed}", f"train.seed={seed}"]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        result = project.torchship("run", *[arg for s in sets for arg in ("--set", s)], timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "wall_s": round(time.perf_counter() - started, 1),
                "error": f"timed out after {timeout:.0f} s"}
    run = {"seed": seed, "wall_s": round(time.perf_counter() - started, 1), "load_1m_before": round(load, 2)}
    if result.returncode != 0:
        return {**run, "error": failure(result)}
    try:
        return {**run, **read_outcome(project.root)}
    except (OSError, KeyError, ValueError) as exc:   # a report moved or changed shape: say so, run the rest
        return {**run, "error": f"ran, but its reports could not be read: {type(exc).__name__}: {exc}"}


def failure(result: subprocess.CompletedProcess) -> str:
    """The CLI's own `error:` paragraph (stderr) when it wrote one, else the output's tail."""
    text = result.stderr.strip() or result.stdout.strip()
    start = text.rfind("error:")
    return f"exit {result.returncode}: " + (text[start:start + 1500] if start >= 0 else text[-1500:])


def mean_sd(values: list[float]) -> dict[str, float | None]:
    return {"mean": round(statistics.mean(values), 4),
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else None}


def summarize_table(table: Table, runs: list[dict]) -> tuple[dict, dict]:
    """(served figures, baseline figures) for one table: means and spreads over the seeds that finished, the
    gap to the best baseline per metric in points, and whether the goal is met (every seed must finish)."""
    done = [r for r in runs if "error" not in r]
    figures = {"about": table.about, "seeds": [r["seed"] for r in runs], "finished": len(done),
               "errors": {str(r["seed"]): r["error"] for r in runs if "error" in r},
               "wall_s": mean_sd([r["wall_s"] for r in runs]), "runs": runs}
    if not done:
        return {**figures, "goal_met": False}, {}
    baseline = {name: {m: mean_sd([r[name][m] for r in done]) for m in METRICS} for name in BASELINES}
    best = {m: max(BASELINES, key=lambda name: baseline[name][m]["mean"]) for m in METRICS}
    served = {m: mean_sd([r["served"][m] for r in done]) for m in METRICS}
    gaps = {m: round(100 * (baseline[best[m]][m]["mean"] - served[m]["mean"]), 2) for m in METRICS}
    figures |= {"rows": done[0]["rows"], "features": done[0]["features"], "classes": done[0]["classes"],
                "served": served, "teacher": {m: mean_sd([r["teacher"][m] for r in done]) for m in METRICS},
                "served_variants": sorted({r["served_variant"] for r in done}),
                "bless_passed": sum(r["bless"] == "pass" for r in done), "gap_points": gaps,
                "goal_met": len(done) == len(runs) and max(gaps.values()) <= GOAL_POINTS}
    return figures, {**baseline, "best": best}


def f1_ratio(served: dict, baseline: dict) -> float:
    """Served macro-F1 / the best baseline's (0 when no seed finished)."""
    if not baseline:
        return 0.0
    return served["served"]["f1_macro"]["mean"] / baseline[baseline["best"]["f1_macro"]]["f1_macro"]["mean"]


def save_results(seeds: list[int], per_table: dict[str, dict], per_baseline: dict[str, dict],
                 started: float) -> None:
    """bench/results/tables.json in the house format; headline = the worst table."""
    gaps = {name: f.get("gap_points", {m: 100.0 for m in METRICS}) for name, f in per_table.items()}
    worst = max(gaps, key=lambda name: max(gaps[name].values()))
    met = sum(f["goal_met"] for f in per_table.values())
    ratio = min(f1_ratio(per_table[name], per_baseline[name]) for name in per_table)
    full = set(per_table) == set(TABLES) and len(seeds) >= FULL_SEEDS
    notes = "" if full else (f"PARTIAL RUN (a dry run, not the bench result): tables {', '.join(per_table)}, "
                             f"{len(seeds)} seed(s); rerun the full matrix with `make bench-tables`. ")
    code = git_state(ROOT)
    notes += (f"Code: commit {code['git_commit'][:10]}, uncommitted changes {code['git_dirty']} (each project copy "
              f"takes the working tree's tracked files). Each cell = mean (± sd) over seeds "
              f"{', '.join(map(str, seeds))} (prepare.seed = train.seed) of one real `torchship run` per table and "
              f"seed in a fresh project copy at params.yaml's defaults; served = the variant profile selects (what "
              f"register publishes), scored on the holdout; baselines = the baseline stage on the same split; gap = "
              f"best baseline mean - served mean, in points, per metric; ratio = served macro-F1 / best baseline "
              f"macro-F1 on the worst table; wall = the whole `torchship run` (its ephemeral Prefect API start "
              f"included) on a {os.cpu_count()}-core machine shared with other work.")
    save("tables", f"Holdout quality per table: served variant vs the best scikit-learn baseline, "
                   f"mean over {len(seeds)} seed(s)",
         {"tables_met": f"{met}/{len(per_table)}", "worst_table": worst,
          "worst_gap_points": max(gaps[worst].values()), "seeds": len(seeds),
          "bench_wall_s": round(time.perf_counter() - started), "per_table": per_table},
         {"models": "logistic regression, hist gradient boosting; best per table and metric",
          "per_table": per_baseline},
         ratio, f"served within {GOAL_POINTS:g} point of the best baseline (accuracy and macro-F1) on every table",
         met == len(per_table) if full else None, notes=notes)


def print_run(table: str, run: dict) -> None:
    if "error" in run:
        print(f"[{table} seed {run['seed']}] FAILED after {run['wall_s']} s: {run['error']}", flush=True)
        return
    cells = "  ".join(f"{who} " + "/".join(f"{run[who][m]:.4f}" for m in METRICS) for who in ("served", *BASELINES))
    print(f"[{table} seed {run['seed']}] {run['wall_s']} s  {run['served_variant']} (bless {run['bless']})  "
          f"acc/F1: {cells}", flush=True)


def parse_args() -> argparse.Namespace:
    about, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=about, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated, from {', '.join(TABLES)}")
    parser.add_argument("--seeds", type=int, default=FULL_SEEDS, help="seeds per table (42, 43, ...)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one `torchship run` may take")
    parser.add_argument("--keep", type=Path, help="keep every project copy under this folder (else deleted)")
    args = parser.parse_args()
    args.tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    unknown = [t for t in args.tables if t not in TABLES]
    if unknown or args.seeds < 1:
        parser.error(f"unknown table(s) {unknown}; choose from {', '.join(TABLES)}" if unknown else "--seeds >= 1")
    if any(TABLES[t].write_file for t in args.tables):
        try:
            import palmerpenguins  # noqa: F401
        except ImportError:
            parser.error("the penguins table needs the bench extra: pip install -e '.[bench]' (or make bench-tables)")
    return args


def main() -> None:
    args = parse_args()
    first = load_params(ROOT / "params.yaml").prepare.seed   # seed 0 = params.yaml's own split (and train.seed)
    seeds = [first + i for i in range(args.seeds)]
    started = time.perf_counter()
    per_table, per_baseline = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.tables:
            runs = []
            for seed in seeds:
                folder = (args.keep or Path(scratch)) / f"{name}-{seed}"
                folder.mkdir(parents=True, exist_ok=False)
                runs.append(run_once(TABLES[name], seed, folder, args.timeout))
                print_run(name, runs[-1])
            per_table[name], per_baseline[name] = summarize_table(TABLES[name], runs)
            save_results(seeds, per_table, per_baseline, started)   # after each table: a crash keeps the rest


if __name__ == "__main__":
    main()
