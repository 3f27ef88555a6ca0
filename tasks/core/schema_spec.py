"""The feature schema a model expects: ordered features, the target and its class labels.

It travels with every model (inside the ONNX file's metadata), so training, export and serving agree on
one row encoding (tasks/core/encoding.py). A spec: fields and parsing, no project imports but errors.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from tasks.core.errors import DataError
from tasks.modalities.image.contract import ReadLimits


class Feature(BaseModel):
    name: str
    kind: Literal["numeric", "categorical"]
    categories: list[str] = []
    # From the declared contract, when there is one: what a served request may hold.
    min: float | None = None
    max: float | None = None
    nullable: bool = True
    closed_categories: bool = False   # an unseen category is refused (not mapped to "unknown")



class ImageShape(BaseModel):
    """What an image model takes: (height, width, channels) uint8 pixels of one mode, at this size after the one
    resize rule (tasks/modalities/image/decode.py fit_size)."""

    height: int
    width: int
    channels: int
    mode: Literal["L", "RGB"]
    limits: ReadLimits | None = None   # the rule set its training images were read by; None: exported before it was

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, self.channels


class Schema(BaseModel):
    """What a model expects: ordered features (tables) or one image shape (images), the target and its class
    labels. A schema without `modality` is a table's (every model exported before images were)."""

    source: str
    target: str
    classes: list[str]
    features: list[Feature] = []
    modality: Literal["table", "image"] = "table"
    image: ImageShape | None = None

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def is_image(self) -> bool:
        return self.modality == "image"

    def signature(self) -> list[tuple[str, str]]:
        """Input signature: names and kinds (an image's shape and mode); two models are comparable only if these
        match."""
        if self.is_image:
            return [("image", f"uint8 {self.image.height}x{self.image.width}x{self.image.channels} {self.image.mode}")]
        return [(f.name, f.kind) for f in self.features]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> Schema:
        return cls.model_validate_json(text)



def load_schema(path: Path) -> Schema:
    return Schema.from_json(Path(path).read_text())



def schema_from_metadata(metadata: dict[str, str]) -> Schema:
    """The schema an exported ONNX model carries in its metadata."""
    if "torchship.schema" not in metadata:
        raise DataError("model file carries no torchship schema: it was not exported by torchship.")
    return Schema.model_validate(json.loads(metadata["torchship.schema"]))
