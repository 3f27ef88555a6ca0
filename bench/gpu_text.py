"""The text GPU check: the real text train stage with the Transformer (`text_transformer`) on CUDA in fp32, then bf16,
against a plain PyTorch loop of the same Transformer, ids, batch and precision, with each one's steady samples/s
and peak device memory; a few minutes on one GPU. Writes gpu_text.json into bench/results/ and prints the same.

    python bench/gpu_text.py                      # GPU mode: 60,000 generated tickets, 4 epochs at batch 512
    python bench/gpu_text.py --cpu --out F        # CPU mode: 600 tickets, 2 epochs; checks the plumbing only

Runs beside bench/gpu_check.py on a machine with torch and the carried wheels (docs/performance.md, "On a GPU"):
the project is a copy of tasks/, models/ and params.yaml (bench/gpu_project.py), its texts generated and tokenized
by the real prepare stage (`text:tickets`: torchship's own set, so no third-party wheel is needed), nothing
downloaded. The benchmark suite does not run it: it waits for a GPU session.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_project import PLAIN_START, TIMED_EPOCHS, pairs_main, run_module, set_params  # noqa: E402

GPU = {"generated": 60_000, "epochs": 4, "batch_size": 512}
CPU = {"generated": 600, "epochs": 2, "batch_size": 64}
TRAIN = {"model": "text_transformer", "adapt": False, "checkpoint_every": 0, "patience": 100}

# The baseline's data part (bench/gpu_project.py has the rest): the training split's token ids and labels as
# tensors on the device, the same Transformer built from the schema's layout.
TEXT_DATA = r'''
from pathlib import Path
from tasks.modalities.text import MODALITY
from tasks.modalities.text.layout import fit_text_layout
split = MODALITY.read_split(Path("data/prepare/train.parquet"), schema)
x, y = torch.from_numpy(split.inputs).to(device), torch.from_numpy(split.labels).to(device)
model = build_model(spec["name"], fit_text_layout(schema), **spec["kwargs"]).to(device)
'''
PLAIN_LOOP = PLAIN_START + TEXT_DATA + TIMED_EPOCHS


def prepare(project: Path, sizes: dict, timeout: float) -> dict:
    """The real prepare stage on sizes["generated"] tickets: the splits and tokenizer every run below trains on."""
    generated = sizes["generated"]
    set_params(project, data={"source": "text:tickets"}, text={"generated": generated})
    ran = run_module(project, "tasks.prepare", timeout)
    if ran["returncode"] != 0:
        raise RuntimeError(f"the prepare stage failed: {ran['stderr_tail']}")
    return {"texts": generated, "seconds": ran["wall_s"]}


def main() -> None:
    pairs_main(__doc__, "gpu_text", {"gpu": GPU, "cpu": CPU}, prepare, TRAIN, PLAIN_LOOP, "texts")


if __name__ == "__main__":
    main()
