"""Batch scoring in bounded memory: `torchship predict` vs pandas read_csv of the whole file + one ONNX Runtime call.

One tiny `torchship run` in a throwaway copy of this working tree registers a champion (the model's size moves
the process's floor, not what scoring adds). The holdout rows are repeated into CSV files. Peak resident memory
of each process comes from the kernel (wait4's ru_maxrss), so nothing samples and nothing is missed.
- floor: each tool on a 10-row file (imports, the model, no data to speak of);
- the memory bound: what `torchship predict` adds above its floor on a file of BOUND_CHUNKS chunks (one chunk
  alone holds about half of it: reader, writer and allocator settle after a few);
- the big file: at least ten times that bound (and at least MIN_BIG_MB), scored by `torchship predict`: what it
  adds above its floor there, against the bound;
- side by side on a 1/SLICE slice of it (the baseline on the whole big file held ~18 GiB before it was stopped):
  what each tool adds above its own floor, and the ratio baseline / predict.
The baseline scores the same bytes (the champion's model.onnx) and writes its predictions to CSV too.

Run: python bench/bench_predict.py [--project DIR] (a project whose pipeline already ran) [--min-big-mb 200]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_serving import prepare, project_env  # noqa: E402
from bench.common import save  # noqa: E402

BIN = Path(sys.executable).parent
MIN_BIG_MB = 200
SLICE = 16  # the naive baseline runs on 1/SLICE of the big file (see main)
BOUND_CHUNKS = 16   # the bound is measured on a file of this many chunks: past a few, what predict adds is flat


def refreshed(root: Path) -> Path:
    """A project prepared before, with this working tree's code (the CLI included)."""
    for package in ("serving", "tasks", "models", "flows"):
        shutil.copytree(ROOT / package, root / package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


def write_rows(holdout_csv: str, rows: int, path: Path) -> int:
    """`rows` data lines: the holdout's lines repeated (header once). Returns the file's size in bytes."""
    header, *lines = holdout_csv.splitlines(keepends=True)
    with path.open("w") as handle:
        handle.write(header)
        written = 0
        while written < rows:
            take = lines[: rows - written]
            handle.writelines(take)
            written += len(take)
    return path.stat().st_size


def peak(command: list[str], cwd: Path, env: dict) -> tuple[float, float, int]:
    """(peak RSS in MiB, wall seconds, exit code) of one child process."""
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{command[:3]} failed ({code}): {child.stderr.read().decode()[-2000:]}")
    return usage.ru_maxrss / 1024, seconds, code


def baseline(source: str, model: str, output: str) -> None:
    """The naive batch job: the whole file in memory, one ONNX Runtime call, the predictions written."""
    import pandas as pd

    from tasks.core.runtime import open_onnx
    from tasks.core.schema_spec import schema_from_metadata
    from tasks.modalities.scoring import predict_proba

    frame = pd.read_csv(source)
    session = open_onnx(Path(model), 2)
    schema = schema_from_metadata(session.get_modelmeta().custom_metadata_map)
    probabilities = predict_proba(session, schema, frame)
    out = pd.DataFrame(probabilities, columns=[f"probability_{c}" for c in schema.classes])
    out.insert(0, "prediction", [schema.classes[i] for i in probabilities.argmax(1)])
    out.to_csv(output, index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, help="a project whose pipeline already ran")
    parser.add_argument("--min-big-mb", type=float, default=MIN_BIG_MB)
    parser.add_argument("--baseline", nargs=3, metavar=("CSV", "ONNX", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        return baseline(*args.baseline)
    import pandas as pd
    from mlflow import MlflowClient

    from tasks.core.scored_files import CHUNK_ROWS
    from tasks.registry.read import download_onnx

    work = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    root = refreshed(args.project.resolve()) if args.project else prepare("default", work / "project", tiny=True)
    env = project_env(root)
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    name = client.search_registered_models()[0].name
    version = str(client.get_model_version_by_alias(name, "champion").version)
    model = download_onnx(client, name, version, work / "model")
    holdout = pd.read_parquet(root / "data/prepare/holdout.parquet").to_csv(index=False)

    def predict(source: Path) -> tuple[float, float, int]:
        return peak([str(BIN / "torchship"), "predict", str(source), "-o", str(work / "out.csv")], root, env)

    def naive(source: Path) -> tuple[float, float, int]:
        return peak([sys.executable, __file__, "--baseline", str(source), str(model), str(work / "naive.csv")],
                    root, env)

    sizes = {label: write_rows(holdout, rows, work / f"{label}.csv")
             for label, rows in (("floor", 10), ("chunk", BOUND_CHUNKS * CHUNK_ROWS))}
    floor, chunk = predict(work / "floor.csv"), predict(work / "chunk.csv")
    bound_mb = max(chunk[0] - floor[0], 1.0)
    row_bytes = sizes["chunk"] / (BOUND_CHUNKS * CHUNK_ROWS)
    big_mb = max(10 * bound_mb, args.min_big_mb)
    big_rows = int(big_mb * (1 << 20) / row_bytes) + 1
    sizes["big"] = write_rows(holdout, big_rows, work / "big.csv")
    print(f"bound {bound_mb:.1f} MiB above a {floor[0]:.0f} MiB floor; big file {sizes['big'] / (1 << 20):.0f} MiB, "
          f"{big_rows:,} rows", flush=True)
    ours = predict(work / "big.csv")
    print(f"predict on the big file: peak {ours[0]:.0f} MiB, {ours[1]:.0f} s", flush=True)
    # The naive job on the big file held ~18 GiB when it was stopped (2026-11-30, tiny params; this machine is
    # shared): it runs on a slice instead, beside predict on the same slice.
    slice_rows = big_rows // SLICE
    write_rows(holdout, slice_rows, work / "slice.csv")
    ours_slice, naive_floor, naive_slice = (predict(work / "slice.csv"), naive(work / "floor.csv"),
                                            naive(work / "slice.csv"))
    ours_added, naive_added = ours_slice[0] - floor[0], naive_slice[0] - naive_floor[0]
    figures = {"file_mib": round(sizes["big"] / (1 << 20), 1), "rows": big_rows,
               "file_over_bound": round(sizes["big"] / (1 << 20) / bound_mb, 1),
               "bound_mib": round(bound_mb, 1), "floor_mib": round(floor[0], 1), "peak_mib": round(ours[0], 1),
               "added_mib": round(ours[0] - floor[0], 1), "rows_per_s": round(big_rows / ours[1]),
               "chunk_rows": CHUNK_ROWS, "slice_rows": slice_rows, "slice_added_mib": round(ours_added, 1),
               "slice_rows_per_s": round(slice_rows / ours_slice[1])}
    baseline_figures = {"slice_rows": slice_rows, "floor_mib": round(naive_floor[0], 1),
                        "slice_peak_mib": round(naive_slice[0], 1), "slice_added_mib": round(naive_added, 1),
                        "slice_rows_per_s": round(slice_rows / naive_slice[1])}
    ratio = naive_added / max(ours_added, 1.0)
    save("predict", "torchship predict: peak memory on a file ten times its bound (vs pandas read_csv + one "
         "ONNX Runtime call)", figures, baseline_figures, ratio,
         "memory added above the floor stays within 1.2x the bound on a file >= 10x that bound",
         figures["added_mib"] <= 1.2 * bound_mb and figures["file_over_bound"] >= 10,
         notes=f"{name} v{version} (tiny params), CSV of the holdout rows repeated; peak RSS from wait4. The bound: "
               f"what predict adds above its floor (a 10-row file) on a {BOUND_CHUNKS}-chunk file. "
               f"The naive baseline held ~18 GiB on the big file when it was stopped (a shared machine), so both "
               f"also ran on a 1/{SLICE} slice of it: ratio = memory the baseline adds / memory predict adds there, "
               f"above each one's floor")

if __name__ == "__main__":
    main()
