"""The feature schema a model expects: ordered features, the target and its class labels.

It travels with every model (inside the ONNX file's metadata), so training, export and serving agree on
one row encoding (tasks/modalities/table/encoding.py). A spec: fields and parsing, no project imports but errors.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tasks.core.errors import DataError


class Feature(BaseModel):
    name: str
    kind: Literal["numeric", "categorical"]
    categories: list[str] = []
    # From the declared contract, when there is one: what a served request may hold.
    min: float | None = None
    max: float | None = None
    nullable: bool = True
    closed_categories: bool = False   # an unseen category is refused (not mapped to "unknown")



class Schema(BaseModel):
    """What a model expects: the target and its class labels, the modality that prepared it (none: the fallback
    modality's, as every table exported before modalities were named), and what its inputs are: a table's ordered
    features, or another modality's own spec in `inputs` (its package reads it)."""

    source: str
    target: str
    classes: list[str]
    features: list[Feature] = []
    modality: str | None = None   # the modality package that prepared it (tasks/modalities/); None: the fallback's
    inputs: dict[str, Any] = {}   # the modality's own input spec (an image's shape, a text's tokenizer): its package's

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

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
