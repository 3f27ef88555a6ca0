"""The trained model on disk: a weights-only checkpoint holding the state dict, the feature layout fitted on
the training split, the model's name and arguments and the classes, so it can be rebuilt without pickle."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models import build_model
from models.cnn import ImageLayout
from models.ensemble import FoldEnsemble
from models.tabular import FeatureLayout
from tasks.core.artifacts import write_atomic
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import TrainParams
from tasks.core.schema_spec import Schema
from tasks.training.model_args import chosen_model_kwargs


def fit_layout(features: np.ndarray, schema: Schema) -> FeatureLayout | ImageLayout:
    """Numeric mean/std and category counts (an image's channel mean/std) from the training split only."""
    if schema.is_image:
        return fit_image_layout(features, schema)
    numeric = [j for j, f in enumerate(schema.features) if f.kind == "numeric"]
    categorical = [j for j, f in enumerate(schema.features) if f.kind == "categorical"]
    values = features[:, numeric].astype(np.float64)
    mean = np.nan_to_num(np.nanmean(values, axis=0)) if numeric else np.zeros(0)
    std = np.nan_to_num(np.nanstd(values, axis=0), nan=1.0) if numeric else np.zeros(0)
    std = np.where(std < 1e-8, 1.0, std)
    return FeatureLayout(numeric_index=numeric, categorical_index=categorical,
                         cardinalities=[len(schema.features[j].categories) for j in categorical],
                         numeric_mean=[float(v) for v in mean], numeric_std=[float(v) for v in std],
                         n_classes=len(schema.classes))


def fit_image_layout(pixels: np.ndarray, schema: Schema) -> ImageLayout:
    """Per-channel mean and std (0..1 scale) of the training images, in chunks (a large set is not copied to
    float whole)."""
    channels = pixels.shape[3]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for start in range(0, len(pixels), 4096):
        chunk = pixels[start:start + 4096].reshape(-1, channels).astype(np.float64) / 255.0
        total += chunk.sum(axis=0)
        squares += (chunk ** 2).sum(axis=0)
        count += len(chunk)
    mean = total / max(1, count)
    std = np.sqrt(np.maximum(squares / max(1, count) - mean ** 2, 0.0))
    std = np.where(std < 1e-4, 1.0, std)
    image = schema.image
    return ImageLayout(height=image.height, width=image.width, channels=image.channels,
                       mean=[float(v) for v in mean], std=[float(v) for v in std], n_classes=len(schema.classes))


def layout_from_dict(saved: dict) -> FeatureLayout | ImageLayout:
    """A saved layout, of either modality (an image layout has a height)."""
    return ImageLayout(**saved) if "height" in saved else FeatureLayout(**saved)


def model_spec(params: TrainParams) -> dict:
    """Name and constructor arguments, saved beside the weights so export can rebuild the model."""
    return {"name": params.model, "kwargs": chosen_model_kwargs(params)}


def save_trained(path: Path, model: nn.Module, layout: FeatureLayout | ImageLayout, spec: dict, classes: list[str],
                 threshold: float | None = None) -> None:
    """Tensors and primitives only, written atomically: `load_trained` reads it with weights_only=True. `threshold`:
    a binary model's decision threshold on P(class 1) (tasks/training/decision.py), which export writes into the
    ONNX file's metadata."""
    saved = {"state_dict": model.state_dict(), "layout": layout.to_dict(), "model": spec, "classes": list(classes)}
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
    model = build_trained(checkpoint["model"], layout_from_dict(checkpoint["layout"]))
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), checkpoint


def build_trained(spec: dict, layout: FeatureLayout | ImageLayout) -> nn.Module:
    """The untrained module a saved spec describes: one model, or (with `members`, from cross-validation) that
    many of it averaged as one FoldEnsemble."""
    if spec.get("members"):
        bias = [0.0] * layout.n_classes if spec.get("class_bias") else None   # its values load with the weights
        return FoldEnsemble([build_model(spec["name"], layout, **spec["kwargs"]) for _ in range(spec["members"])],
                            class_bias=bias)
    return build_model(spec["name"], layout, **spec["kwargs"])
