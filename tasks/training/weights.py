"""The trained model on disk: a weights-only checkpoint holding the state dict, the layout fitted on the training
split (its modality's), the model's name and arguments and the classes, so it can be rebuilt without pickle."""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from models import build_model
from models.ensemble import FoldEnsemble
from tasks.core.artifacts import write_atomic
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import TrainParams
from tasks.modalities import modality_named
from tasks.training.model_args import chosen_model_kwargs


def model_spec(params: TrainParams) -> dict:
    """Name and constructor arguments, saved beside the weights so export can rebuild the model."""
    return {"name": params.model, "kwargs": chosen_model_kwargs(params)}


def save_trained(path: Path, model: nn.Module, layout, spec: dict, classes: list[str], modality: str,
                 threshold: float | None = None) -> None:
    """Tensors and primitives only, written atomically: `load_trained` reads it with weights_only=True. `threshold`:
    a binary model's decision threshold on P(class 1) (tasks/training/decision.py), which export writes into the
    ONNX file's metadata."""
    saved = {"state_dict": model.state_dict(), "layout": layout.to_dict(), "modality": modality, "model": spec,
             "classes": list(classes)}
    if threshold is not None:
        saved["threshold"] = float(threshold)
    write_atomic(path, lambda tmp: torch.save(saved, tmp))


def load_trained(path: Path) -> tuple[nn.Module, dict]:
    """Rebuild the eager model from its weights-only checkpoint (never unpickles code)."""
    try:
        checkpoint = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:   # torch's own advice (weights_only=False) would run the payload
        reason = next((line for line in str(exc).splitlines() if "GLOBAL" in line or "Unsupported" in line), "")
        raise TorchshipError(f"{path} is not a torchship weights file: it asks to run code when loaded "
                             f"({reason.strip()}). It was refused and nothing in it ran; "
                             "re-create it with the train stage (torchship run), "
                             "and never load it with weights_only=False.") from None
    if "modality" not in checkpoint:
        raise TorchshipError(f"{path} names no modality: it was written by an older torchship. Re-create it with the "
                             "train stage (torchship run).")
    layout = modality_named(checkpoint["modality"]).layout_from_dict(checkpoint["layout"])
    model = build_trained(checkpoint["model"], layout)
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), checkpoint


def build_trained(spec: dict, layout) -> nn.Module:
    """The untrained module a saved spec describes: one model, or (with `members`, from cross-validation) that
    many of it averaged as one FoldEnsemble."""
    if spec.get("members"):
        bias = [0.0] * layout.n_classes if spec.get("class_bias") else None   # its values load with the weights
        return FoldEnsemble([build_model(spec["name"], layout, **spec["kwargs"]) for _ in range(spec["members"])],
                            class_bias=bias)
    return build_model(spec["name"], layout, **spec["kwargs"])
