"""Serving variants side by side: eager fp32 teacher (the baseline), torch.compile, ONNX Runtime fp32
and int8, the int8 student, and whatever the pipeline selected, each end-to-end (raw encoded rows in,
preprocessing inside the graph) and model-only (already preprocessed inputs).

The artifacts are the pipeline's own: a throwaway project runs prepare -> train -> export -> compress
-> profile at the default params, then every variant is timed here in interleaved rounds (1 thread each).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.core.env import COMPILE_THREADS, TELEMETRY_OFF, set_defaults  # noqa: E402

set_defaults(COMPILE_THREADS)   # before torch is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.common import save  # noqa: E402
from tasks.config import read_params_file  # noqa: E402
from tasks.core.runtime import onnx_runner  # noqa: E402
from tasks.core.schema_spec import load_schema  # noqa: E402
from tasks.core.timing import time_interleaved  # noqa: E402
from tasks.modalities import load_holdout  # noqa: E402
from tasks.training.weights import load_trained  # noqa: E402
from tasks.variants.exporters import export_onnx  # noqa: E402
from tasks.variants.quantize import quantize_onnx  # noqa: E402
from tasks.variants.runners import compiled_runner, eager_runner  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", 5))
CALLS = int(os.environ.get("BENCH_CALLS", 2000))
BATCH = 256
STAGES = ("prepare", "train", "export", "compress", "profile")


class ModelOnly(nn.Module):
    """The network without its preprocessing: preprocessed (B, D) inputs -> logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.classify(features)


def network_of(model: nn.Module) -> nn.Module:
    """The network to time model-only: a calibrated single model is served inside a one-member FoldEnsemble that
    carries its temperature (one division, not the network's cost), so its member."""
    members = getattr(model, "members", None)
    return members[0] if members is not None and len(members) == 1 else model


def build_pipeline(folder: Path) -> Path:
    """Default params, stages run as DVC would run them."""
    from tests.conftest import make_project

    project = make_project(folder, tiny=False)
    env = {**os.environ, **TELEMETRY_OFF}
    for stage in STAGES:
        print(f"stage {stage} ...", flush=True)
        subprocess.run([sys.executable, "-m", f"tasks.{stage}"], cwd=project.root, check=True, env=env,
                       stdout=subprocess.DEVNULL)
    return project.root


def onnx_pair(model: nn.Module, folder: Path, name: str, width: int) -> tuple[Path, Path]:
    """Model-only ONNX (fp32 and dynamic int8) of a model's network without its preprocessing."""
    fp32, int8 = folder / f"{name}.model-only.onnx", folder / f"{name}.model-only.int8.onnx"
    torch.onnx.export(ModelOnly(model).eval(), (torch.zeros(4, width),), str(fp32), dynamo=False, input_names=["x"],
                      output_names=["logits"], opset_version=17,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    quantize_onnx(fp32, int8)
    return fp32, int8


def profile_exporter(root: Path) -> str:
    return json.loads((root / "data/export/parity.json").read_text())["exporter"]


def measure(runners: dict, inputs: dict) -> dict:
    """Interleaved rounds; per variant the median over rounds of batch-1 p50/p99 and batch-256 rows/s."""
    samples = {name: {"p50": [], "p99": [], "rps": []} for name in runners}
    for round_ in range(ROUNDS):
        for name, runner in runners.items():   # each variant its own inputs (model-only or raw), so in turn
            rows = inputs[name]
            block = np.resize(rows, (BATCH, rows.shape[1])).astype(np.float32)
            timings = time_interleaved({name: runner}, [row[None] for row in rows[:64]], block, CALLS, 0.5)
            latencies = timings.latencies_us[name]
            samples[name]["p50"].append(float(np.percentile(latencies, 50)))
            samples[name]["p99"].append(float(np.percentile(latencies, 99)))
            samples[name]["rps"].append(timings.rows_per_s[name])
        print(f"round {round_ + 1}/{ROUNDS} done", flush=True)
    return {name: {"p50_us": round(statistics.median(s["p50"]), 1), "p99_us": round(statistics.median(s["p99"]), 1),
                   "rows_per_s": round(statistics.median(s["rps"]))} for name, s in samples.items()}


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        root = build_pipeline(Path(folder) / "project")
        os.chdir(root)
        schema = load_schema(Path("data/prepare/schema.json"))
        holdout = load_holdout(schema)
        rows = holdout.inputs[:2048]
        served_teacher, saved = load_trained(Path("data/train/model.pt"))
        teacher = network_of(served_teacher)
        teacher_spec = saved["model"]
        student, _ = load_trained(Path("data/compress/student/model.pt"))
        profile = json.loads(Path("data/profile/report.json").read_text())
        compress = json.loads(Path("data/compress/report.json").read_text())
        selected = profile["selected"]
        files = {"onnx-fp32": Path("data/export/model.onnx"),
                 "onnx-int8": Path("data/compress/variants/model.int8.onnx"),
                 "onnx-int8-static": Path("data/compress/variants/model.int8-static.onnx"),
                 "student-onnx-fp32": Path("data/compress/variants/student.onnx"),
                 "student-onnx-int8": Path("data/compress/variants/student.int8.onnx")}
        with torch.no_grad():
            teacher_z = teacher.preprocess(torch.from_numpy(rows)).numpy()
            student_z = student.preprocess(torch.from_numpy(rows)).numpy()
        exporter = profile_exporter(root)
        other = "legacy" if exporter == "dynamo" else "dynamo"
        files[f"onnx-fp32-{other}"] = Path(folder) / f"teacher.{other}.onnx"
        export_onnx(served_teacher, schema, other, files[f"onnx-fp32-{other}"])
        t_fp32, t_int8 = onnx_pair(teacher, Path(folder), "teacher", teacher_z.shape[1])
        s_fp32, s_int8 = onnx_pair(student, Path(folder), "student", student_z.shape[1])
        shown = ["eager-fp32", "eager-compile", "onnx-fp32", "onnx-int8", "student-onnx-int8"]
        if selected not in shown:
            shown.append(selected)
        exporters = [f"onnx-fp32-{other}"]  # the ONNX exporter not chosen, end-to-end only
        end_to_end = {"eager-fp32": eager_runner(served_teacher), "eager-compile": compiled_runner(served_teacher),
                      **{name: onnx_runner(files[name], 1) for name in shown if name in files}}
        model_only = {"eager-fp32": eager_runner(ModelOnly(teacher).eval()),
                      "eager-compile": compiled_runner(ModelOnly(teacher).eval()),
                      "onnx-fp32": onnx_runner(t_fp32, 1), "onnx-int8": onnx_runner(t_int8, 1),
                      "student-onnx-fp32": onnx_runner(s_fp32, 1), "student-onnx-int8": onnx_runner(s_int8, 1)}
        end_to_end.update({name: onnx_runner(files[name], 1) for name in exporters})
        runners = {**{f"{n} e2e": end_to_end[n] for n in shown + exporters},
                   **{f"{n} model": model_only[n] for n in shown if n in model_only}}
        inputs = {name: (rows if name.endswith("e2e") else (student_z if name.startswith("student") else teacher_z))
                  for name in runners}
        results = measure(runners, inputs)
    defaults = read_params_file(ROOT / "params.yaml")
    base, chosen = results["eager-fp32 e2e"], results[f"{selected} e2e"]
    p50_ratio = chosen["p50_us"] / base["p50_us"]
    throughput_ratio = chosen["rows_per_s"] / base["rows_per_s"]
    gate = compress["variants"].get(selected, {}).get("drop")
    figures = {"selected": selected, **{f"{name} {k}": v for name, r in results.items() for k, v in r.items()
                                        if not name.startswith("eager-fp32 ")},
               "onnx_exporter": exporter,
               "selected_p50_ratio": round(p50_ratio, 3), "selected_throughput_ratio": round(throughput_ratio, 2),
               f"selected_{compress['metric']}_drop_points": round(gate["drop"] * 100, 2) if gate else 0.0}
    baseline = {f"eager-fp32 {kind} {k}": v
                for kind in ("e2e", "model") for k, v in results[f"eager-fp32 {kind}"].items()}
    within_budget = gate is None or gate["drop"] <= compress["max_drop"]
    save("variants", "Serving variants: selected variant vs eager fp32 teacher (batch-1 latency, batch-256 throughput)",
         figures, baseline, p50_ratio, "selected p50 <= 0.25x eager teacher, throughput >= 3x, within accuracy budget",
         p50_ratio <= 0.25 and throughput_ratio >= 3 and within_budget,
         notes=f"ratio = selected batch-1 p50 / eager teacher p50. Teacher {teacher_spec['name']} "
               f"{teacher_spec['kwargs']}, student MLP {defaults['distill']['hidden']}; default data "
               f"(100k rows); 1 thread; median of {ROUNDS} interleaved rounds of {CALLS} batch-1 calls and 0.5 s at "
               f"batch {BATCH}. e2e = encoded raw rows in, preprocessing in the graph; model = preprocessed inputs "
               "to the network alone. eager-compile = torch.compile(dynamic=False). onnx-fp32 is the pipeline's "
               "exporter (onnx_exporter); onnx-fp32-<other> is the teacher from the other exporter, same run.")


if __name__ == "__main__":
    main()
