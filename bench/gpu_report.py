"""bench/gpu_check.py's result: the GPU targets judged on the variants' figures, the JSON (bench/common.py's
result format, plus every variant, the targets, the versions and what was skipped) and the printed summary."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

TITLE = "GPU check: the train stage on a GPU vs a plain PyTorch loop (bench/gpu_check.py)"


def _ran(results: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in results if r["status"] == "ran"}


def _figure(ran: dict[str, dict], name: str, key: str):
    return ran[name]["figures"].get(key) if name in ran else None


# Each GPU target: key -> (what, the goal as text, the check). judge_targets measures them.
TARGETS = {
    "first_epoch_ratio": ("epoch 1 / a later epoch, compile off (worst variant)", "<= 2.0", lambda v: v <= 2.0),
    "outside_epochs_s": ("seconds of the stage outside its epochs, default data (worst of ddp fp32/bf16)", "<= 15",
                         lambda v: v <= 15),
    "large_samples_per_s": ("samples/s on the 1M-row table, adapt's GPU batch, bf16", ">= 400,000",
                            lambda v: v >= 400_000),
    "large_f1_gain": ("val F1 (argmax) on 1M rows: adapt's GPU batch less batch 512", ">= -0.005",
                      lambda v: v >= -0.005),
    "stage_vs_plain": ("steady samples/s, the train stage / the plain loop, default data (worst of bf16, fp32)",
                       ">= 1.0", lambda v: v >= 1.0),
    "fsdp_vs_ddp": ("FSDP (1 process) epoch / DDP epoch, bf16", "<= 1.5", lambda v: v <= 1.5),
    "export_parity": ("export's parity gates pass on the GPU-trained weights", "true", lambda v: v is True),
    "nproc_refused": ("train.nproc > GPUs refused before torchrun, with the fix", "true", lambda v: v is True),
}


def measure_targets(results: list[dict]) -> dict:
    """Each target's measured value (None: its variants did not run)."""
    ran = _ran(results)
    eager = [r for r in ran.values() if r["kind"] == "train" and not r["settings"].get("compile")]
    ratios = [r["figures"]["first_epoch_ratio"] for r in eager if r["figures"].get("first_epoch_ratio")]
    outside = [r["figures"]["outside_epochs_s"] for n, r in ran.items() if n in ("ddp-fp32", "ddp-bf16")]
    large, base = (_figure(ran, name, "val_f1_at_argmax") for name in ("large-adapt-bf16", "large-batch512-bf16"))
    pairs = [_figure(ran, f"ddp-{p}", "steady_samples_per_s") / _figure(ran, f"plain-{p}", "samples_per_s")
             for p in ("bf16", "fp32") if f"ddp-{p}" in ran and f"plain-{p}" in ran]
    fsdp, ddp = _figure(ran, "fsdp-bf16", "later_epoch_s"), _figure(ran, "eager-short-bf16", "later_epoch_s")
    return {"first_epoch_ratio": max(ratios) if ratios else None,
            "outside_epochs_s": max(outside) if outside else None,
            "large_samples_per_s": _figure(ran, "large-adapt-bf16", "steady_samples_per_s"),
            "large_f1_gain": None if large is None or base is None else round(large - base, 4),
            "stage_vs_plain": round(min(pairs), 3) if pairs else None,
            "fsdp_vs_ddp": None if not fsdp or not ddp else round(fsdp / ddp, 2),
            "export_parity": _figure(ran, "export", "all_publishable"),
            "nproc_refused": _figure(ran, "nproc-over-gpus", "refused_before_torchrun")}


def judge_targets(results: list[dict]) -> list[dict]:
    """Each target: what was measured, the goal, whether it is met (None where it was not measured)."""
    measured = measure_targets(results)
    return [{"key": key, "target": what, "measured": measured[key], "goal": goal,
             "met": None if measured[key] is None else bool(check(measured[key]))}
            for key, (what, goal, check) in TARGETS.items()]


def write_result(out: Path | None, mode: str, results: list[dict], machine: dict, versions: dict, made: dict,
                 setup_s: float, elapsed_s: float) -> Path:
    """The JSON at `out` (a temporary file when None): bench/common.py's fields, then the details."""
    ran = _ran(results)
    targets = judge_targets(results)
    if mode == "cpu":   # a tiny MLP on the CPU: its figures say the plumbing works, not whether a GPU meets a goal
        targets = [{**t, "met": None, "note": "CPU mode: the goal is a GPU's"} for t in targets]
    judged = [t["met"] for t in targets if t["met"] is not None]
    precision = "bf16" if "plain-bf16" in ran else "fp32"   # the headline pair: bf16's where it ran
    stage, plain = (_figure(ran, f"ddp-{precision}", "steady_samples_per_s"),
                    _figure(ran, f"plain-{precision}", "samples_per_s"))
    figures = {"mode": mode, "variants_ran": len(ran), "variants_skipped": sum(r["status"] == "skipped"
                                                                             for r in results),
               "variants_failed": sum(r["status"] == "failed" for r in results), "elapsed_s": round(elapsed_s, 1),
               **{t["key"]: t["measured"] for t in targets if not isinstance(t["measured"], bool)}}
    payload = {
        "name": "gpu", "title": TITLE if mode == "gpu" else TITLE + " — CPU mode (plumbing only, no GPU figure)",
        "figures": figures, "baseline": {f"plain_loop_{precision}_samples_per_s": plain and round(plain)},
        "ratio": round(stage / plain, 3) if stage and plain else 0.0,
        "goal": "every GPU target met, every variant ran", "mode": mode,
        "goal_met": (all(judged) and not figures["variants_failed"]) if mode == "gpu" else None,
        "notes": ("the real train stage (`python -m tasks.train`) per variant in a scratch project, export on the "
                  "weights of the run before it, a plain loop on the same data/model/batch/precision; "
                  f"setup (tables, MLflow store) {setup_s:.0f} s" + ("; CPU mode: a tiny MLP on 3,000 rows, its "
                                                                     "figures are no GPU's" if mode == "cpu" else "")),
        "machine": machine, "versions": versions, "tables_made": made, "targets": targets, "variants": results,
        "skipped": [{"name": r["name"], "reason": r["reason"]} for r in results if r["status"] == "skipped"],
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out is None:
        out = Path(tempfile.gettempdir()) / f"torchship-gpu-check-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    return out


def print_summary(path: Path) -> None:
    result = json.loads(path.read_text())
    print(f"\n{result['title']} ({result['measured_at']}): {path}")
    for variant in result["variants"]:
        figures = variant.get("figures", {})
        shown = {k: figures[k] for k in ("steady_samples_per_s", "samples_per_s", "first_epoch_ratio",
                                         "outside_epochs_s", "val_f1_at_argmax", "peak_device_memory_mb",
                                         "all_publishable", "refused_before_torchrun") if k in figures}
        print(f"  {variant['name']:22s} {variant['status']:8s} {variant.get('reason') or shown}")
    for target in result["targets"]:
        met = {True: "met", False: "NOT MET", None: target.get("note", "not measured")}[target["met"]]
        print(f"  target: {target['target']}: {target['measured']} (goal {target['goal']}): {met}")
    for skipped in result["skipped"]:
        print(f"  skipped {skipped['name']}: {skipped['reason']}")
