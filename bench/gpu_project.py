"""bench/gpu_check.py's scratch project: torchship's code and a prepared table in a folder of their own, the real
stages run in it (`python -m tasks.train`, `python -m tasks.export`), the figures read back from what they wrote,
and a plain PyTorch loop on the same data, model and batch for the ratio. Nothing beyond torchship's own
dependencies, no git and no package index: what a GPU machine with torch and the carried wheels has."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("tasks", "models", "params.yaml")
PREPARED = ("train.parquet", "val.parquet", "holdout.parquet", "schema.json")

# The baseline: what one writes by hand, on the same device, precision, data, model and batch. It times epochs 2..N
# (epoch 1 warms the device up) and prints one JSON line. Its data part is per modality (bench/gpu_images.py has
# the images'); each leaves x, y and the model on `device`.
PLAIN_START = r'''
import json, os, statistics, sys, time
import torch
from torch import nn
sys.path.insert(0, ".")
from models import build_model
from tasks.config import load_params
from tasks.core.schema_spec import load_schema
from tasks.training.weights import model_spec
batch, epochs, precision = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
params = load_params().train
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.set_num_threads(params.threads or os.cpu_count() or 1)   # the stage's own rule for one process
if device.type == "cuda" and precision == "fp32":
    torch.set_float32_matmul_precision("high")
torch.manual_seed(0)
schema = load_schema("data/prepare/schema.json")
spec = model_spec(params)
'''
TABLE_DATA = r'''
import pandas as pd
from tasks.modalities.table.encoding import encode_features
from tasks.core.labels import encode_target
from tasks.modalities.table.layout import fit_layout
frame = pd.read_parquet("data/prepare/train.parquet")
x = torch.from_numpy(encode_features(frame, schema)); y = torch.from_numpy(encode_target(frame[schema.target], schema))
model = build_model(spec["name"], fit_layout(x.numpy(), schema), **spec["kwargs"]).to(device)
x, y = x.to(device), y.to(device)
'''
TIMED_EPOCHS = r'''
optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr or 1e-3, weight_decay=params.weight_decay)
loss_fn = nn.CrossEntropyLoss()
autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
model.train()
seconds = []
for epoch in range(epochs):
    started = time.perf_counter()
    order = torch.randperm(len(y), device=device); xs, ys = x[order], y[order]
    for i in range(0, len(ys), batch):
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(model(xs[i:i + batch]), ys[i:i + batch])
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds.append(time.perf_counter() - started)
later = statistics.median(seconds[1:] or seconds)
peak = torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else None
print(json.dumps({"samples_per_s": len(y) / later, "epoch_s": seconds, "rows": len(y), "batch": batch,
                  "device": str(device), "precision": precision, "peak_device_memory_mb": peak}))
'''
PLAIN_LOOP = PLAIN_START + TABLE_DATA + TIMED_EPOCHS


def python_env() -> dict[str, str]:
    """The stages' environment: this interpreter's folder first on PATH (torchrun's workers), telemetry off."""
    sys.path.insert(0, str(ROOT))
    from tasks.core.env import TELEMETRY_OFF

    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **TELEMETRY_OFF}


def make_project(folder: Path) -> Path:
    """torchship's code and params.yaml copied into `folder` (no git, no data)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in CODE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            shutil.copy2(source, folder / name)
    return folder


def set_params(project: Path, **sections: dict) -> None:
    """Merge `sections` (e.g. train={...}) into the project's params.yaml, validated first; model_args whole."""
    from ruamel.yaml import YAML

    from tasks.config import parse_params

    path, yaml = project / "params.yaml", YAML()
    document = yaml.load(path.read_text())
    for section, values in sections.items():
        document[section].update(values)
    parse_params(json.loads(json.dumps(document)), origin=str(path))
    with path.open("w") as handle:
        yaml.dump(document, handle)


def run_module(project: Path, module: str, timeout: float, *args: str) -> dict:
    """`python -m module` in the project: exit code, wall seconds and the end of its error output."""
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=project, env=python_env(),
                              capture_output=True, text=True, timeout=max(1.0, timeout))
        code, tail = done.returncode, (done.stderr or "")[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = None, f"timed out after {timeout:.0f} s: {(exc.stderr or b'')[-2000:]!r}"
    return {"returncode": code, "wall_s": round(time.perf_counter() - started, 2), "stderr_tail": tail}


def make_data(folder: Path, rows: int, project: Path | None = None, timeout: float = 1800) -> dict:
    """The prepare stage's outputs for `rows` rows of the synthetic default, written to `folder` (by the stage run in
    `project`, or in a project of its own made beside `folder` and removed after)."""
    own = project is None
    project = make_project(folder.parent / f".{folder.name}-project") if own else project
    set_params(project, data={"rows": rows})
    ran = run_module(project, "tasks.prepare", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the prepare stage failed: {ran['stderr_tail']}")
    folder.mkdir(parents=True, exist_ok=True)
    for name in PREPARED:
        shutil.copy2(project / "data" / "prepare" / name, folder / name)
    if own:
        shutil.rmtree(project, ignore_errors=True)
    return {"rows": rows, "seconds": ran["wall_s"]}


def use_data(project: Path, folder: Path) -> int:
    """Put a prepared table (a make_data folder) in the project; returns its training rows."""
    import pyarrow.parquet as pq

    target = project / "data" / "prepare"
    target.mkdir(parents=True, exist_ok=True)
    missing = [name for name in PREPARED if not (folder / name).exists()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a prepared table: {', '.join(missing)} missing "
                                "(write one with --make-data)")
    for name in PREPARED:
        shutil.copy2(folder / name, target / name)
    shutil.rmtree(project / "data" / "train", ignore_errors=True)
    return pq.ParquetFile(target / "train.parquet").metadata.num_rows


def warm_tracking(project: Path) -> None:
    """Create the project's MLflow store before any timed run, as the pipeline's earlier stages do."""
    code = "from tasks.config import load_params; from tasks.core.tracking import configure_mlflow; " \
           "configure_mlflow(load_params().tracking)"
    subprocess.run([sys.executable, "-c", code], cwd=project, env=python_env(), check=True, capture_output=True)


def train_figures(project: Path, wall_s: float) -> dict:
    """What one train stage run measured, from its metrics.json and history.csv."""
    import pandas as pd

    metrics = json.loads((project / "data/train/metrics.json").read_text())
    history = pd.read_csv(project / "data/train/history.csv")
    seconds = history["seconds"].tolist()
    later = statistics.median(seconds[1:]) if len(seconds) > 1 else None
    epochs_s = float(sum(seconds))
    timeline = dict(sorted(metrics.get("timeline_s", {}).items(), key=lambda item: item[1]))
    fitted = metrics.get("fitted") or {}
    return {
        "wall_s": round(wall_s, 2), "epochs_s": round(epochs_s, 2), "outside_epochs_s": round(wall_s - epochs_s, 2),
        "outside_breakdown_s": outside_breakdown(timeline, epochs_s, wall_s),
        "epochs": len(seconds), "first_epoch_s": round(seconds[0], 3),
        "later_epoch_s": None if later is None else round(later, 3),
        "first_epoch_ratio": None if not later else round(seconds[0] / later, 2),
        "steady_samples_per_s": round(statistics.median(history["samples_per_s"].tolist()[1:] or
                                                        history["samples_per_s"].tolist())),
        "val_f1_macro": round(metrics["val_f1_macro"], 4),
        "val_f1_at_argmax": round((metrics.get("decision") or {}).get("at_default", metrics["val_f1_macro"]), 4),
        "model": fitted.get("model"), "batch_size": fitted.get("batch_size"), "lr": fitted.get("lr"),
        "fitted_reasons": fitted.get("reasons", []),
        **{key: metrics.get(key) for key in ("device_name", "peak_device_memory_mb", "peak_rss_mb", "precision",
                                             "precision_note", "notes", "strategy", "world_size", "backend")}}


# What ends at each mark of the worker's timeline (tasks/training/timeline.py).
PHASES = {"worker_started": "launcher and torchrun start", "imported": "worker imports",
          "process_group": "process group", "loaded": "loading", "trained": "validation and checkpoints",
          "calibrated": "calibration and saving", "plots": "metrics and plots", "mlflow": "MLflow"}


def outside_breakdown(timeline: dict[str, float], epochs_s: float, wall_s: float) -> dict[str, float]:
    """The stage's seconds outside its epochs, by phase: the gaps between the worker's timeline marks (the epochs
    taken out of the training phase), then its exit and torchrun's after the last mark."""
    parts, previous = {}, 0.0
    for name, at in timeline.items():
        parts[PHASES.get(name, name)] = round(at - previous - (epochs_s if name == "trained" else 0.0), 2)
        previous = at
    parts["worker and torchrun exit"] = round(wall_s - previous, 2)
    return parts


def plain_loop(project: Path, batch: int, epochs: int, precision: str, timeout: float,
               script: str = PLAIN_LOOP) -> dict:
    """The hand-written loop's steady samples/s (epochs 2..N) on the project's training split."""
    done = subprocess.run([sys.executable, "-c", script, str(batch), str(epochs), precision], cwd=project,
                          env=python_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the plain loop failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def stage_figures(project: Path, train: dict, timeout: float) -> dict:
    """The real train stage with `train` merged into the project's params (old checkpoints removed first, so it
    starts afresh): its figures (train_figures)."""
    set_params(project, train=train)
    for old in (project / "data/train/checkpoints").glob("*"):
        old.unlink()
    started = time.perf_counter()
    ran = run_module(project, "tasks.train", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the train stage ({train.get('precision')}) exited {ran['returncode']}: "
                           f"{ran['stderr_tail']}")
    return train_figures(project, time.perf_counter() - started)


def precision_pairs(project: Path, train: dict, sizes: dict, timeout: float, plain_script: str,
                    unit: str) -> dict:
    """Per precision (fp32, then bf16): the train stage with `train` and the plain loop `plain_script`, both at
    `sizes`' batch and epochs, and the ratio of their steady `unit`/s."""
    figures = {}
    for precision in ("fp32", "bf16"):
        ours = stage_figures(project, {**train, "epochs": sizes["epochs"], "batch_size": sizes["batch_size"],
                                       "precision": precision}, timeout)
        theirs = plain_loop(project, sizes["batch_size"], sizes["epochs"], precision, timeout, plain_script)
        figures[precision] = {"stage": ours, "plain_loop": theirs,
                              "ratio": round(ours["steady_samples_per_s"] / theirs["samples_per_s"], 3)}
        print(f"{precision}: stage {ours['steady_samples_per_s']:,} {unit}/s (peak "
              f"{ours.get('peak_device_memory_mb')} MB), plain loop {theirs['samples_per_s']:,.0f} {unit}/s (peak "
              f"{theirs['peak_device_memory_mb']} MB): {figures[precision]['ratio']}x", flush=True)
    return figures


def pairs_main(doc: str, name: str, sizes: dict[str, dict], prepare: Callable[[Path, dict, float], dict],
               train: dict, plain_script: str, unit: str) -> None:
    """A modality's GPU check (bench/gpu_images.py, bench/gpu_text.py): the real prepare stage in a scratch project
    (`prepare(project, sizes, timeout)`), the precision pairs, judged (the stage >= 0.95x the plain loop at each)
    and written to bench/results/<name>.json (or --out). `--cpu` takes sizes["cpu"] and checks the plumbing only."""
    import argparse
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny data, no GPU needed: checks the plumbing only")
    parser.add_argument("--out", type=Path, default=ROOT / f"bench/results/{name}.json")
    parser.add_argument("--timeout", type=float, default=150, help="seconds allowed to each stage or loop run")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --cpu to check the plumbing, or on a GPU machine")
    chosen, started = sizes["cpu" if args.cpu else "gpu"], time.perf_counter()
    figures: dict = {"mode": "cpu" if args.cpu else "gpu", "sizes": chosen, "train": train,
                     "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    with tempfile.TemporaryDirectory(prefix=f"torchship-{name}-") as folder:
        project = make_project(Path(folder) / "project")
        figures["prepare"] = prepare(project, chosen, args.timeout)
        figures.update(precision_pairs(project, train, chosen, args.timeout, plain_script, unit))
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    figures["goal"] = f"the stage >= 0.95x the plain loop's steady {unit}/s at each precision"
    figures["met"] = all(figures[p]["ratio"] >= 0.95 for p in ("fp32", "bf16"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out} in {figures['wall_s']} s; goal met: {figures['met']}"
          + (" (CPU mode: plumbing only, no GPU's figures)" if args.cpu else ""))


def export_figures(project: Path) -> dict:
    """The export stage's parity report on the weights the last train run left: each variant and whether it passed."""
    parity = json.loads((project / "data/export/parity.json").read_text())
    variants = {name: {"publishable": found["publishable"], "status": found["gate"]["status"],
                       "reasons": found["gate"]["reasons"], "seconds": found["seconds"]}
                for name, found in parity.items() if isinstance(found, dict) and "publishable" in found}
    return {"headline": parity.get("headline"), "variants": variants,
            "all_publishable": bool(variants) and all(v["publishable"] for v in variants.values())}
