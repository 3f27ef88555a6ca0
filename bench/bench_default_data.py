"""The default data before and after the small-tables work: does the large end keep its quality and train time?

Cross-validated ensembles, the family chosen on evidence, calibration and the decision rule changed what train does
below train.cv_max_rows; the default data (synthetic, 100,000 rows) lies above it and must keep its holdout quality
(within 1 point of macro-F1) and its train time (at most 1.1x). Both commits are cloned from this repository into a
temporary folder and run `torchship run` at the default params, one after the other, in this venv with each clone's
code first on PYTHONPATH. Read back: the train stage's own seconds (data/train/metrics.json `train_seconds`) and the
registered version's holdout accuracy and macro-F1 (its `holdout_*` tags, scored by bless on the same holdout rows).

The baseline is the commit before that work (`--before`, default BEFORE): ratio = train seconds after / before.
Run: python bench/bench_default_data.py [--before REV] [--after REV] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
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

BEFORE = "3e46df9^"   # the parent of the first small-tables commit (cross-validated members below cv_max_rows)
MODEL = "synthetic-churn"
MAX_F1_DROP_POINTS, MAX_TRAIN_RATIO = 1.0, 1.1


def commit_of(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short=12", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def run_default(rev: str, folder: Path) -> dict:
    """Clone `rev` into `folder`, `torchship run` there at the default params; its figures."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(folder)], check=True)
    subprocess.run(["git", "checkout", "--quiet", rev], cwd=folder, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
    env["PYTHONPATH"] = str(folder)
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "torchship"), "run"], cwd=folder, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"torchship run at {rev} failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
    from mlflow import MlflowClient

    store = f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}"
    [version] = MlflowClient(tracking_uri=store, registry_uri=store).search_model_versions(f"name='{MODEL}'")
    trained = json.loads((folder / "data/train/metrics.json").read_text())
    figures = {"commit": commit_of(rev), "train_s": round(trained["train_seconds"], 1),
               "holdout_f1_macro": round(float(version.tags["holdout_f1_macro"]), 4),
               "holdout_accuracy": round(float(version.tags["holdout_accuracy"]), 4),
               "epochs_run": trained.get("epochs_run"), "run_wall_s": round(wall, 1)}
    print(f"{rev}: {figures}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"the baseline commit (default {BEFORE})")
    parser.add_argument("--after", default="HEAD", help="the commit measured (default HEAD; commit your changes)")
    parser.add_argument("--keep", type=Path, help="keep both clones under this folder")
    args = parser.parse_args()
    folder, load = args.keep or Path(tempfile.mkdtemp(prefix="bench-default-data-")), os.getloadavg()[0]
    try:
        before = run_default(args.before, folder / "before")
        after = run_default(args.after, folder / "after")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    ratio = after["train_s"] / before["train_s"]
    drop = 100 * (before["holdout_f1_macro"] - after["holdout_f1_macro"])
    save("default_data", "The default data (synthetic, 100,000 rows) before and after the small-tables work: train "
         "stage time and holdout quality", {**after, "f1_drop_points": round(drop, 2)}, before, ratio,
         f"holdout macro-F1 within {MAX_F1_DROP_POINTS:g} point of before; train stage <= {MAX_TRAIN_RATIO:g}x before",
         drop <= MAX_F1_DROP_POINTS and ratio <= MAX_TRAIN_RATIO,
         notes=f"One `torchship run` at the default params per commit, in fresh clones, run one after the other in "
               f"the same venv (each clone's code first on PYTHONPATH); train_s is the train stage's own seconds "
               f"(data/train/metrics.json), holdout figures the registered version's holdout_* tags. before = "
               f"{args.before}, the parent of the first small-tables commit. Load average at the start: "
               f"{load:.1f}.")


if __name__ == "__main__":
    main()
