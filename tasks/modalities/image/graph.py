"""The served image graph: raw uint8 pixels (N, H, W, C) at the model's size in; logits, probabilities, the served
label (one-hot `decision`) and a small fixed random projection of the model's own penultimate embedding out. The
normalisation is inside the model (models/cnn.py), so ONNX Runtime, `mlflow models serve` and torchship's service
feed the same pixels and answer the same probabilities.

The embedding output is what the monitor watches instead of raw images (Evidently's EmbeddingsDrift): a model that
has `logits_and_embedding(x)` gives its penultimate features, projected to PROJECTED dimensions by a seeded Gaussian
matrix held in the graph; one that has not gives its logits, projected alike."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from tasks.core.gate import GateResult
from tasks.core.graph_nodes import MODEL, assemble, at_opset
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import DECISION, EMBEDDING, RAW_INPUTS
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import image_shape
from tasks.modalities.scoring import predict_proba

INPUT = "image"   # the served graph's input: uint8 (N, H, W, C) pixels at the model's size
PROJECTED = 16
OUTPUTS = ("logits", "probabilities", DECISION, EMBEDDING)


class ServedImageModel(nn.Module):
    """(B, H, W, C) uint8 -> (logits (B, C), embedding projection (B, k)): what the export stage traces."""

    def __init__(self, model: nn.Module, example: torch.Tensor, seed: int = 0):
        super().__init__()
        self.model = model
        with torch.no_grad():
            width = self._features(example)[1].shape[1]
        generator = torch.Generator().manual_seed(seed)
        k = min(PROJECTED, width)
        self.register_buffer("projection", torch.randn(width, k, generator=generator) / math.sqrt(k))

    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = getattr(self.model, "logits_and_embedding", None)
        if both is not None:
            return both(x)
        logits = self.model(x)
        return logits, logits

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, features = self._features(x)
        return logits, features.float() @ self.projection


def compose_image_model(model, schema: Schema):
    """The bare exported model (input `x` uint8 (N, H, W, C), outputs `logits` and `embedding`) behind the input
    `image`, with `probabilities` (softmax), `decision` (the served label, one-hot) and `embedding`; metadata
    kept, plus `torchship.inputs=raw`."""
    from onnx import TensorProto, compose, helper

    from tasks.core.runtime import decision_threshold

    outputs = {o.name for o in model.graph.output}
    if [i.name for i in model.graph.input] != ["x"] or not {"logits", EMBEDDING} <= outputs:
        raise ValueError("the image model to compose must take one input `x` and give `logits` and `embedding`")
    metadata = {p.key: p.value for p in model.metadata_props}
    inner = compose.add_prefix(at_opset(model), MODEL)
    height, width, channels = image_shape(schema).shape
    front = [helper.make_node("Identity", [INPUT], [f"{MODEL}x"])]
    inputs = [helper.make_tensor_value_info(INPUT, TensorProto.UINT8, ["batch", height, width, channels])]
    projected = next(o for o in model.graph.output if o.name == EMBEDDING).type.tensor_type.shape.dim[-1].dim_value
    n_classes = len(schema.classes)
    shapes = {"logits": n_classes, "probabilities": n_classes, DECISION: n_classes, EMBEDDING: projected or None}
    outputs = [helper.make_tensor_value_info(name, TensorProto.INT64 if name == DECISION else TensorProto.FLOAT,
                                             ["batch", shapes[name]]) for name in OUTPUTS]
    return assemble(inner, front, inputs, outputs, decision_threshold(metadata), n_classes,
                    {**metadata, **RAW_INPUTS}, "torchship-image", passed=(EMBEDDING,))


def embedding_width(path) -> int:
    """The width of a served image graph's `embedding` output (PROJECTED, or the model's own when narrower)."""
    import onnx

    output = next(o for o in onnx.load(str(path), load_external_data=False).graph.output if o.name == EMBEDDING)
    return output.type.tensor_type.shape.dim[-1].dim_value or PROJECTED


def image_signature(schema: Schema, projected: int):
    """The MLflow signature of a composed image graph: the uint8 (-1, H, W, C) tensor `image` in; logits,
    probabilities and the decision (N, C) and the embedding projection (N, k) out."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema as Columns
    from mlflow.types import TensorSpec

    classes = len(schema.classes)
    outputs = [TensorSpec(np.dtype(np.int64 if name == DECISION else np.float32),
                          (-1, projected if name == EMBEDDING else classes), name) for name in OUTPUTS]
    return ModelSignature(inputs=Columns([TensorSpec(np.dtype(np.uint8), (-1, *image_shape(schema).shape), INPUT)]),
                          outputs=Columns(outputs))


def probe_images(pixels: np.ndarray, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The export parity probe: `count` holdout images (real ones) plus edge images (black, white, noise and a
    checkerboard: saturated inputs a wrong normalisation or a broken kernel shows on), and which holdout images
    were taken (their labels judge the accuracy delta)."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(pixels), size=min(count, len(pixels)), replace=False))
    shape = pixels.shape[1:]
    checker = ((np.indices(shape[:2]).sum(axis=0) % 2) * 255).astype(np.uint8)[:, :, None].repeat(shape[2], axis=2)
    edges = np.stack([np.zeros(shape, np.uint8), np.full(shape, 255, np.uint8),
                      rng.integers(0, 256, shape, dtype=np.uint8), checker])
    return np.concatenate([pixels[chosen], edges]), chosen


def check_raw_parity(name: str, variant, composed, schema: Schema, probe: np.ndarray,
                           rules: ExportParams) -> GateResult:
    """The bare image variant (pixels as `x`) vs the served graph (pixels as `image`) on the probe images:
    probabilities within parity_atol and the same class on every image."""
    reference, raw = predict_proba(variant, schema, probe), predict_proba(composed, schema, probe)
    diff = np.nan_to_num(np.abs(reference - raw), nan=np.inf).max(axis=1)
    failures = []
    if (diff > rules.parity_atol).any():
        failures.append(f"{int((diff > rules.parity_atol).sum())} of {len(probe)} probe images differ by more than "
                        f"export.parity_atol {rules.parity_atol:g} (worst {diff.max():.3g})")
    flipped = np.flatnonzero(reference.argmax(1) != raw.argmax(1))
    if len(flipped):
        failures.append(f"{len(flipped)} probe images change class (images {flipped[:10].tolist()})")
    return GateResult.decide(f"raw parity {name}", failures,
                             passed=f"max probability diff {diff.max():.2e}, same class on all {len(probe)} images")
