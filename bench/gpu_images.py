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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_project import PLAIN_START, TIMED_EPOCHS, pairs_main, run_module, set_params  # noqa: E402

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


def prepare(project: Path, sizes: dict, timeout: float) -> dict:
    """The real prepare stage on sizes["rendered"] shapes: the shards every run below trains on."""
    rendered = sizes["rendered"]
    set_params(project, data={"source": "images:shapes"}, images={"rendered": rendered, "augment": NO_AUGMENT})
    ran = run_module(project, "tasks.prepare", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the prepare stage failed: {ran['stderr_tail']}")
    return {"images": rendered, "seconds": ran["wall_s"]}


def main() -> None:
    pairs_main(__doc__, "gpu_images", {"gpu": GPU, "cpu": CPU}, prepare, TRAIN, PLAIN_LOOP, "images")


if __name__ == "__main__":
    main()
