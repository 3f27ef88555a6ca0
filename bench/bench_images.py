"""Images: the modality's figures from real pipeline runs, each beside its baseline measured in the same run.

- quality: `torchship run` at params.yaml's defaults on two sets, `images:digits` (scikit-learn's handwritten
  digits: not made by torchship) and `images:shapes` (rendered by torchship), each in a throwaway copy of this
  working tree (tests.conftest.make_project). The served graph (data/profile/model.onnx) is scored on the holdout
  beside the logistic regression on downsampled pixels and the majority class the baseline stage fit, with paired
  bootstrap intervals (1,000 resamples, 95%) of served minus baseline. Goal: the served model at least the pixel
  regression on both sets (the interval's upper end above 0).
- compression: the static int8 and the distilled student of each run, their size and accuracy beside the fp32
  teacher's (the compress stage's report).
- training speed: the train stage (`python -m tasks.train`, torchrun, 1 process) on the shapes set's splits vs a
  plain PyTorch loop of the same CNN on the same data, batch, epochs and threads, augmentation off in both, in
  alternating rounds (the best of each counts). Goal: >= 0.95x the plain loop's samples/s.
- pipeline time: the digits run's wall time (install excluded) beside the tabular default's (`torchship run` on
  the synthetic table, same machine, same bench run). Goal: <= 1.5x.

Run: python bench/bench_images.py [--rounds 2] [--dry-run]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402
from tasks.core.env import TELEMETRY_OFF  # noqa: E402

SETS = {"digits": "images:digits", "shapes": "images:shapes"}
SPEED = {"epochs": 2, "adapt": False, "batch_size": 128, "threads": 1, "checkpoint_every": 0, "patience": 10}
PLAIN_LOOP = r'''
import json, resource, sys, time
import numpy as np, torch
from torch import nn
sys.path.insert(0, ".")
from models import build_model
from tasks.config import load_params
from tasks.core.schema_spec import load_schema
from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.layout import fit_image_layout
from tasks.modalities.image.shards import read_metadata, read_pixels
from tasks.training.weights import model_spec

params = load_params().train
torch.set_num_threads(params.threads)
torch.manual_seed(0)
schema = load_schema("data/prepare/schema.json")
x = torch.from_numpy(read_pixels("data/prepare/train.parquet", image_shape(schema).shape).copy())
labels = read_metadata("data/prepare/train.parquet", schema.target)["label"]
y = torch.tensor([schema.classes.index(str(v)) for v in labels])
spec = model_spec(params.model_copy(update={"model": "resnet"}))
model = build_model("resnet", fit_image_layout(x.numpy(), schema), **spec["kwargs"])
optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr or 3e-3, weight_decay=params.weight_decay)
loss_fn = nn.CrossEntropyLoss()
model.train()
started = time.perf_counter()
for epoch in range(params.epochs):
    order = torch.randperm(len(y)); xs, ys = x[order], y[order]
    for i in range(0, len(ys), params.batch_size):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(xs[i:i + params.batch_size]), ys[i:i + params.batch_size]).backward()
        optimizer.step()
seconds = time.perf_counter() - started
print(json.dumps({"samples_per_s": params.epochs * len(y) / seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
    return {**clean, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{clean['PATH']}", **TELEMETRY_OFF}


def run_pipeline(folder: Path, source: str, overrides: dict | None = None, tiny: bool = False) -> tuple[Path, float]:
    """`torchship run` at the defaults (tests' tiny params with `tiny`, then `overrides`) on `source` in a fresh
    project copy: (its root, wall seconds)."""
    from tests.conftest import make_project

    project = make_project(folder, {"data": {"source": source}, **(overrides or {})}, tiny=tiny).root
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "torchship"), "run"], cwd=project, env=env(),
                          capture_output=True, text=True, timeout=7200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"torchship run on {source} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return project, seconds


def quality(project: Path) -> dict:
    """The served graph's holdout accuracy and macro-F1 beside each baseline's, with paired bootstrap intervals."""
    os.chdir(project)
    from tasks.core.metrics import classification_metrics, paired_bootstrap
    from tasks.core.params_spec import BaselineParams
    from tasks.core.runtime import open_onnx
    from tasks.core.schema_spec import load_schema
    from tasks.modalities import load_holdout
    from tasks.modalities.image import baseline as images_baseline
    from tasks.modalities.scoring import predict_labels

    schema = load_schema(Path("data/prepare/schema.json"))
    holdout = load_holdout(schema)
    served = predict_labels(open_onnx(Path("data/profile/model.onnx"), 1), schema, holdout.inputs)
    train = load_holdout(schema, Path("data/prepare/train.parquet"))
    _, predicted = images_baseline.fit_and_predict(train.inputs, train.labels, holdout.inputs, holdout.labels,
                                                   len(schema.classes), BaselineParams(), False)
    n = len(schema.classes)
    figures = {"holdout_images": len(holdout.labels), "served": classification_metrics(holdout.labels, served, n)}
    for name in (images_baseline.PIXELS, images_baseline.MAJORITY):
        figures[name] = {**classification_metrics(holdout.labels, predicted[name], n),
                         "served_minus_baseline_accuracy": paired_bootstrap(holdout.labels, served, predicted[name], n,
                                                                           "accuracy")}
    compress = json.loads(Path("data/compress/report.json").read_text())
    figures["compression"] = {"fp32": {"bytes": compress["fp32"]["bytes"],
                                       "accuracy": compress["fp32"]["accuracy"]}} | {
        name: {"bytes": entry.get("bytes"), "accuracy": entry["metrics"]["accuracy"],
               "publishable": entry["publishable"]}
        for name, entry in compress["variants"].items() if "metrics" in entry}
    os.chdir(ROOT)
    return figures


def set_train(project: Path, **train) -> None:
    from ruamel.yaml import YAML

    path = project / "params.yaml"
    yaml = YAML()
    document = yaml.load(path.read_text())
    document["train"].update(train)
    document["images"]["augment"].update({"shift": 0, "brightness": 0.0, "flip": False})
    with path.open("w") as handle:
        yaml.dump(document, handle)


def training_speed(project: Path, rounds: int) -> tuple[dict, dict]:
    """The train stage vs the plain loop on the project's prepared splits, alternating; the best of each."""
    set_train(project, **SPEED, model="resnet")
    stage, plain = [], []
    for _ in range(rounds):
        for path in (project / "data/train/checkpoints").glob("*"):
            path.unlink()
        subprocess.run([sys.executable, "-m", "tasks.train"], cwd=project, env=env(), check=True, capture_output=True)
        metrics = json.loads((project / "data/train/metrics.json").read_text())
        stage.append({"samples_per_s": metrics["samples_per_s"], "peak_rss_mb": metrics["peak_rss_mb"]})
        out = subprocess.run([sys.executable, "-c", PLAIN_LOOP], cwd=project, env=env(), check=True,
                             capture_output=True, text=True)
        plain.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = lambda runs: max(runs, key=lambda r: r["samples_per_s"])  # noqa: E731
    return best(stage), best(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args()
    if args.dry_run:
        print(f"torchship run on {', '.join(SETS.values())} and the synthetic table; the train stage vs a plain loop "
              f"on shapes, {args.rounds} rounds")
        return
    with tempfile.TemporaryDirectory(prefix="torchship-bench-images-") as folder:
        root = Path(folder)
        runs = {name: run_pipeline(root / name, source) for name, source in SETS.items()}
        _, table_seconds = run_pipeline(root / "table", "synthetic")
        figures = {name: quality(project) | {"pipeline_s": round(seconds, 1)}
                   for name, (project, seconds) in runs.items()}
        stage, plain = training_speed(runs["shapes"][0], args.rounds)
    speed = stage["samples_per_s"] / plain["samples_per_s"]
    wall = figures["digits"]["pipeline_s"] / table_seconds
    beats = all(figures[name]["logistic_regression_pixels"]["served_minus_baseline_accuracy"]["high"] > 0
                for name in SETS)
    figures["training"] = {"samples_per_s": round(stage["samples_per_s"]), "plain_samples_per_s":
                           round(plain["samples_per_s"]), "ratio": round(speed, 3), "settings": SPEED}
    figures["pipeline"] = {"digits_s": figures["digits"]["pipeline_s"], "table_s": round(table_seconds, 1),
                           "ratio": round(wall, 3)}
    save("images", "Images: held-out accuracy vs pixel baselines, compression, training speed, pipeline time",
         figures, {"plain_loop_samples_per_s": round(plain["samples_per_s"]),
                   "table_pipeline_s": round(table_seconds, 1)},
         speed, "served >= pixel logistic regression on both sets (interval); train stage >= 0.95x the plain loop; "
                "digits pipeline <= 1.5x the tabular default's",
         beats and speed >= 0.95 and wall <= 1.5,
         notes="params.yaml defaults (adapt on); the install is excluded from both pipeline times; training speed "
               f"on the shapes splits with {SPEED}, augmentation off in both; ratio is training speed's.")


if __name__ == "__main__":
    main()
