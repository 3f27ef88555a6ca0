"""The image GPU check: the real image train stage on CUDA (fp32, then bf16; channels_last is the stage's own choice
on CUDA) against a plain PyTorch loop of the same CNN, data, batch and precision, with each one's samples/s and
peak device memory; at most ~6 minutes on one GPU. Writes gpu_images.json into bench/results/ and prints the same.

    python bench/gpu_images.py                      # GPU mode: 50,000 rendered 32x32 shapes, 4 epochs
    python bench/gpu_images.py --cpu --out F        # CPU mode: 600 shapes, 2 epochs; checks the plumbing only

Runs beside bench/gpu_check.py on a machine with torch and the carried wheels (docs/performance.md, "On a GPU"):
the project is a copy of tasks/, models/ and params.yaml (bench/gpu_project.py), its data rendered by the real
prepare stage, so nothing is downloaded and no git or package index is needed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_project import (  # noqa: E402
    PLAIN_START,
    ROOT,
    TIMED_EPOCHS,
    make_project,
    plain_loop,
    run_module,
    set_params,
    train_figures,
)

GPU = {"rendered": 50_000, "epochs": 4, "batch_size": 512}
CPU = {"rendered": 600, "epochs": 2, "batch_size": 64}
TRAIN = {"model": "resnet", "adapt": False, "checkpoint_every": 0, "patience": 100}
NO_AUGMENT = {"shift": 0, "brightness": 0.0, "flip": False}   # the plain loop has none: the same work on both sides

# The baseline's data part (bench/gpu_project.py has the rest): the split as one uint8 tensor on the device, the
# same CNN in channels_last on CUDA, as an expert would write it.
IMAGE_DATA = r'''
from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.layout import fit_image_layout
from tasks.modalities.image.shards import read_metadata, read_pixels
pixels = read_pixels("data/prepare/train.parquet", image_shape(schema).shape).copy()
labels = read_metadata("data/prepare/train.parquet", schema.target)["label"]
y = torch.tensor([schema.classes.index(str(v)) for v in labels], device=device)
model = build_model(spec["name"], fit_image_layout(pixels, schema), **spec["kwargs"]).to(device)
if device.type == "cuda":
    model = model.to(memory_format=torch.channels_last)
x = torch.from_numpy(pixels).to(device)
'''
PLAIN_LOOP = PLAIN_START + IMAGE_DATA + TIMED_EPOCHS


def prepare(project: Path, rendered: int, timeout: float) -> dict:
    """The real prepare stage on `rendered` shapes: the shards every run below trains on."""
    set_params(project, data={"source": "images:shapes"}, images={"rendered": rendered, "augment": NO_AUGMENT})
    ran = run_module(project, "tasks.prepare", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the prepare stage failed: {ran['stderr_tail']}")
    return {"images": rendered, "seconds": ran["wall_s"]}


def stage(project: Path, precision: str, sizes: dict, timeout: float) -> dict:
    set_params(project, train={**TRAIN, "epochs": sizes["epochs"], "batch_size": sizes["batch_size"],
                               "precision": precision})
    for old in (project / "data/train/checkpoints").glob("*"):
        old.unlink()
    started = time.perf_counter()
    ran = run_module(project, "tasks.train", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the train stage ({precision}) exited {ran['returncode']}: {ran['stderr_tail']}")
    return train_figures(project, time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny data, no GPU needed: checks the plumbing only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/gpu_images.json")
    parser.add_argument("--timeout", type=float, default=150, help="seconds allowed to each stage or loop run")
    args = parser.parse_args()
    import torch

    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --cpu to check the plumbing, or on a GPU machine")
    sizes = CPU if args.cpu else GPU
    started = time.perf_counter()
    figures: dict = {"mode": "cpu" if args.cpu else "gpu", "sizes": sizes, "train": TRAIN,
                     "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    with tempfile.TemporaryDirectory(prefix="torchship-gpu-images-") as folder:
        project = make_project(Path(folder) / "project")
        figures["prepare"] = prepare(project, sizes["rendered"], args.timeout)
        for precision in ("fp32", "bf16"):
            ours = stage(project, precision, sizes, args.timeout)
            theirs = plain_loop(project, sizes["batch_size"], sizes["epochs"], precision, args.timeout, PLAIN_LOOP)
            figures[precision] = {"stage": ours, "plain_loop": theirs,
                                  "ratio": round(ours["steady_samples_per_s"] / theirs["samples_per_s"], 3)}
            print(f"{precision}: stage {ours['steady_samples_per_s']:,} images/s "
                  f"(peak {ours.get('peak_device_memory_mb')} MB), plain loop {theirs['samples_per_s']:,.0f} "
                  f"images/s (peak {theirs['peak_device_memory_mb']} MB): {figures[precision]['ratio']}x", flush=True)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    figures["goal"] = "the stage >= 0.95x the plain loop's steady images/s at each precision"
    figures["met"] = all(figures[p]["ratio"] >= 0.95 for p in ("fp32", "bf16"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out} in {figures['wall_s']} s; goal met: {figures['met']}"
          + (" (CPU mode: plumbing only, no GPU's figures)" if args.cpu else ""))


if __name__ == "__main__":
    main()
