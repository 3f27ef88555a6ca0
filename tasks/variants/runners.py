"""Every way torchship runs a model, as one shape: encoded rows (N, F) float32 -> logits (N, C)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from tasks.core.env import COMPILE_THREADS, set_defaults
from tasks.core.runtime import Runner, onnx_runner  # noqa: F401  (re-exported: one import for every runner)


def eager_runner(model: nn.Module) -> Runner:
    def run(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(rows)).float().numpy()

    return run


def compiled_runner(model: nn.Module) -> Runner:
    """torch.compile (inductor, static shapes: a dynamic graph was much slower here) as rows -> logits.
    A runtime option, not a file: each new batch size compiles once, then is cached."""
    set_defaults(COMPILE_THREADS)
    compiled = torch.compile(model, dynamic=False)

    def run(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return compiled(torch.from_numpy(rows)).numpy()

    return run


def pt2_runner(path: Path) -> Runner:
    """A saved torch.export program (.pt2); loading it runs no pickled code."""
    module = torch.export.load(str(path)).module()
    return lambda rows: module(torch.from_numpy(rows)).detach().numpy()
