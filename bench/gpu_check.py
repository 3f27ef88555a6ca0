"""The GPU check: the real train stage (and export on its weights) on a GPU, every variant the issue names, in at
most ~6 minutes on one GPU, against a plain PyTorch loop on the same data, model and batch; writes
gpu.json in bench/results/ (the machine, the versions, every figure, what was skipped and why) and prints the same.

    python bench/gpu_check.py                                  # GPU mode where CUDA is there (the default data is made)
    python bench/gpu_check.py --data D --large L               # prepared tables from folders (made elsewhere)
    python bench/gpu_check.py --make-data L --rows 1000000     # write a prepared 1M-row table to L, then stop
    python bench/gpu_check.py --cpu --out /tmp/gpu.json        # CPU mode: tiny data, seconds (the suite runs it)

Needs nothing beyond torchship's own dependencies (docs/performance.md, "On a GPU", says which wheels to carry).
The CPU mode checks the plumbing only: its figures are no GPU's and it never writes bench/results/ unless told.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_project import (  # noqa: E402
    ROOT,
    export_figures,
    make_data,
    make_project,
    plain_loop,
    run_module,
    set_params,
    train_figures,
    use_data,
    warm_tracking,
)

DEFAULT_ROWS, LARGE_ROWS, CPU_ROWS = 100_000, 1_000_000, 3_000
SHORT = {"model": "ft_transformer", "adapt": False, "epochs": 3, "batch_size": 512}   # enough for a steady epoch
# CPU mode: a tiny MLP for a few epochs; export without its two slow parts (dynamo ONNX, compile: ~90 s on 2 cores).
CPU_TRAIN = {"model": "mlp", "model_args": {"mlp": {"hidden": [32], "embedding_dim": 4}}, "adapt": False,
             "epochs": 3, "batch_size": 128, "checkpoint_every": 0, "threads": 1}
CPU_EXPORT = {"onnx_exporter": "legacy", "compile": False}
CPU_PAIRS = ("the CPU mode runs one variant per strategy and per precision (ddp-fp32, fsdp-bf16) and the plain loop "
             "beside ddp-fp32; the GPU mode runs them all")
NO_COMPILE_ON_CPU = "CPU mode: torch.compile is measured on a GPU (inductor's C++ build takes minutes on 2 cores)"

# In order of importance: when the time budget runs out, what is left is skipped with the reason. `about_s`: a GPU
# run's rough length, for the budget.
VARIANTS = [
    {"name": "ddp-fp32", "kind": "train", "train": {"precision": "fp32"}, "about_s": 30},
    {"name": "ddp-bf16", "kind": "train", "train": {"precision": "bf16"}, "about_s": 30, "cpu": CPU_PAIRS},
    {"name": "export", "kind": "export", "about_s": 60,
     "what": "the export stage (ONNX, .pt2, compile parity) on the weights the train run before it left"},
    {"name": "plain-bf16", "kind": "plain", "as_in": "ddp-bf16", "about_s": 15, "cpu": CPU_PAIRS},
    {"name": "nproc-over-gpus", "kind": "refuse", "about_s": 10,
     "cpu": "no GPU: on the CPU any train.nproc runs (gloo)"},
    {"name": "large-adapt-bf16", "kind": "train", "table": "large", "train": {"precision": "bf16"}, "about_s": 45,
     "cpu": "the 1M-row table: GPU mode only"},
    {"name": "large-batch512-bf16", "kind": "train", "table": "large", "about_s": 110,
     "train": {"precision": "bf16", "model": "ft_transformer", "adapt": False, "batch_size": 512},
     "cpu": "the 1M-row table: GPU mode only"},
    {"name": "fsdp-fp32", "kind": "train", "train": {**SHORT, "strategy": "fsdp", "precision": "fp32"},
     "about_s": 20, "cpu": CPU_PAIRS},
    {"name": "fsdp-bf16", "kind": "train", "train": {**SHORT, "strategy": "fsdp", "precision": "bf16"},
     "about_s": 20},
    {"name": "compile-bf16", "kind": "train", "train": {**SHORT, "precision": "bf16", "compile": True},
     "about_s": 90, "cpu": NO_COMPILE_ON_CPU},
    {"name": "cuda-graphs-bf16", "kind": "train", "about_s": 100, "cpu": NO_COMPILE_ON_CPU,
     "train": {**SHORT, "precision": "bf16", "compile": True, "compile_mode": "reduce-overhead"}},
    {"name": "eager-short-bf16", "kind": "train", "train": {**SHORT, "precision": "bf16"}, "about_s": 20,
     "cpu": "CPU mode: the compile variants it is the eager yardstick of are GPU-only"},
    {"name": "plain-fp32", "kind": "plain", "as_in": "ddp-fp32", "about_s": 15},
    {"name": "fsdp-2gpus-bf16", "kind": "train", "gpus": 2, "about_s": 30, "cpu": "needs 2 GPUs",
     "train": {**SHORT, "strategy": "fsdp", "precision": "bf16", "nproc": 2}},
]


def gpu_facts() -> dict:
    import torch

    from bench.common import machine

    facts = machine()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpus=torch.cuda.device_count(), gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                     compute_capability=f"{props.major}.{props.minor}", cuda_runtime=torch.version.cuda)
    return facts


def versions() -> dict:
    found = {}
    for name in ("torch", "numpy", "pandas", "pyarrow", "onnx", "onnxscript", "onnxruntime", "mlflow-skinny",
                 "mlflow", "pydantic", "triton"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def run_variant(variant: dict, project: Path, tables: dict[str, Path], gpus: int, cpu: bool, state: dict,
                timeout: float) -> dict:
    """One variant through its real entry point; its settings and figures."""
    kind = variant["kind"]
    if kind == "plain":
        trained = state["trained"][variant["as_in"]]   # the same table, model, batch and precision
        use_data(project, tables["default"])
        set_params(project, train={"model": trained["model"]})
        settings = {"model": trained["model"], "batch_size": trained["batch_size"],
                    "precision": trained["precision"], "epochs": 3, "as_in": variant["as_in"]}
        return {"settings": settings, "figures": plain_loop(project, trained["batch_size"], 3,
                                                            trained["precision"], timeout)}
    if kind == "export":
        ran = run_module(project, "tasks.export", timeout)
        if ran["returncode"] != 0:
            raise RuntimeError(f"export exited {ran['returncode']}: {ran['stderr_tail']}")
        return {"settings": {"weights_of": state["last_trained"], **(CPU_EXPORT if cpu else {})},
                "figures": {"wall_s": ran["wall_s"], **export_figures(project)}}
    if kind == "refuse":
        set_params(project, train={"nproc": gpus + 1})
        ran = run_module(project, "tasks.train", timeout)
        set_params(project, train={"nproc": 1})
        refused = ran["returncode"] == 2 and "train.nproc is" in ran["stderr_tail"]
        return {"settings": {"nproc": gpus + 1, "gpus": gpus},
                "figures": {"refused_before_torchrun": refused, "wall_s": ran["wall_s"],
                            "message": ran["stderr_tail"].strip().splitlines()[-1] if ran["stderr_tail"] else ""}}
    use_data(project, tables[variant.get("table", "default")])
    train = {**variant["train"], **(CPU_TRAIN if cpu else {})}   # the CPU mode's tiny model whatever the variant
    set_params(project, train={"nproc": 1, "compile": False, "compile_mode": "default", "strategy": "ddp",
                               "adapt": True, "epochs": 8, "batch_size": 512, "model": "auto", **train})
    ran = run_module(project, "tasks.train", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the train stage exited {ran['returncode']}: {ran['stderr_tail']}")
    figures = train_figures(project, ran["wall_s"])
    state.setdefault("trained", {})[variant["name"]] = figures
    state["last_trained"] = variant["name"]
    return {"settings": train, "figures": figures}


def skip_reason(variant: dict, cpu: bool, gpus: int, tables: dict, trained: dict, left_s: float) -> str | None:
    if cpu and "cpu" in variant:
        return variant["cpu"]
    if not cpu and variant.get("gpus", 1) > gpus:
        return f"needs {variant['gpus']} GPUs; this machine has {gpus}"
    if variant.get("table") and variant["table"] not in tables:
        return "no 1M-row table (--large DIR, or let the GPU mode make it)"
    if variant.get("as_in") and variant["as_in"] not in trained:
        return f"{variant['as_in']}, whose table, model, batch and precision it copies, did not run"
    if not cpu and variant["about_s"] > left_s:
        return f"time budget: {left_s:.0f} s left of --budget-s, this variant takes about {variant['about_s']} s"
    return None


def main(argv: list[str] | None = None) -> Path | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="CPU mode: tiny data, seconds (plumbing only)")
    parser.add_argument("--data", type=Path, help="a prepared default table (--make-data DIR); else made here")
    parser.add_argument("--large", type=Path, help="a prepared 1M-row table (--make-data DIR --rows 1000000)")
    parser.add_argument("--make-data", type=Path, metavar="DIR", help="write a prepared table to DIR and stop")
    parser.add_argument("--rows", type=int, default=LARGE_ROWS, help="rows for --make-data (default 1,000,000)")
    parser.add_argument("--out", type=Path, help="the JSON to write (GPU mode: bench/results/gpu.json)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop starting variants after this")
    args = parser.parse_args(argv)
    if args.make_data:
        made = make_data(args.make_data.resolve(), args.rows)
        print(f"wrote a prepared {made['rows']:,}-row table to {args.make_data} in {made['seconds']:.0f} s")
        return None
    import torch

    from bench.gpu_report import print_summary, write_result

    cpu = args.cpu or not torch.cuda.is_available()
    gpus = 0 if cpu else torch.cuda.device_count()
    out = args.out or (None if cpu else ROOT / "bench" / "results" / "gpu.json")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="torchship-gpu-check-") as folder:
        scratch = Path(folder)
        project = make_project(scratch / "project")
        tables, made = {}, {}
        for key, given, rows in (("default", args.data, CPU_ROWS if cpu else DEFAULT_ROWS),
                                 ("large", args.large, None if cpu else LARGE_ROWS)):
            if given:
                tables[key] = given.resolve()
            elif rows:   # the prepare stage in the project itself (it also creates the MLflow store)
                made[key] = make_data(scratch / key, rows, project)
                tables[key] = scratch / key
        use_data(project, tables["default"])
        if cpu:
            set_params(project, export=CPU_EXPORT)
        warm_tracking(project)
        setup_s = time.perf_counter() - started
        results, state = [], {"trained": {}}
        for variant in VARIANTS:
            left = args.budget_s - (time.perf_counter() - started)
            reason = skip_reason(variant, cpu, gpus, tables, state["trained"], left)
            entry = {"name": variant["name"], "kind": variant["kind"], "table": variant.get("table", "default")}
            if reason:
                results.append({**entry, "status": "skipped", "reason": reason})
                print(f"skipped {variant['name']}: {reason}", flush=True)
                continue
            print(f"running {variant['name']} ...", flush=True)
            try:
                done = run_variant(variant, project, tables, gpus, cpu, state, max(30.0, left + 20.0))
                results.append({**entry, "status": "ran", **done})
            except Exception as exc:   # recorded, never hidden: a failed variant fails the check
                results.append({**entry, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"[-3000:]})
                print(f"FAILED {variant['name']}: {exc}", flush=True)
        elapsed = time.perf_counter() - started
    path = write_result(out, "cpu" if cpu else "gpu", results, gpu_facts(), versions(), made, setup_s, elapsed)
    print_summary(path)
    return path


if __name__ == "__main__":
    main()
