"""The variants a service answers with: a registered model version loaded for serving (ONNX Runtime
session, the schema it carries, its request row type), and the router that picks one per request."""
from __future__ import annotations

import logging
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel

from serving.validation import row_model
from tasks.contract import Schema, encode_features, schema_from_metadata
from tasks.core.registry import download_onnx
from tasks.core.runtime import open_onnx, softmax

log = logging.getLogger("torchship.serving")


class NoChampion(LookupError):
    """No champion is loaded yet (nothing registered, or the registry was unreachable at start)."""


@dataclass(frozen=True)
class Variant:
    alias: str
    version: str
    schema: Schema
    session: "object"
    row_type: type[BaseModel]   # request rows are validated against this version's own schema

    def predict(self, rows: pd.DataFrame) -> tuple[list[str], np.ndarray]:
        """Raw rows -> (labels, class probabilities (N, C))."""
        probabilities = softmax(self.session.run(None, {"x": encode_features(rows, self.schema)})[0])
        return [self.schema.classes[i] for i in probabilities.argmax(1)], probabilities


def load_variant(client, model_name: str, alias: str, version: str, threads: int) -> Variant:
    """Download and open one registered version. Never unpickles: ONNX only."""
    with tempfile.TemporaryDirectory() as folder:
        session = open_onnx(download_onnx(client, model_name, version, Path(folder)), threads)
    schema = schema_from_metadata(session.get_modelmeta().custom_metadata_map)
    log.info("loaded %s v%s", alias, version)
    return Variant(alias=alias, version=str(version), schema=schema, session=session, row_type=row_model(schema))


@dataclass
class Router:
    """Holds the live variants; swapping a reference is atomic, so requests never see a half-loaded model."""

    champion: Variant | None = None
    challenger: Variant | None = None
    share: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def pick(self) -> Variant:
        """The challenger for `share` of requests (when one is loaded), else the champion."""
        if self.challenger is not None and self.rng.random() < self.share:
            return self.challenger
        if self.champion is None:
            raise NoChampion("no champion model is loaded yet: register one (torchship run) and retry")
        return self.champion

    def other(self, variant: Variant) -> Variant | None:
        """The variant not answering this request (for shadow scoring), if both are loaded."""
        if self.challenger is None or self.champion is None:
            return None
        return self.challenger if variant is self.champion else self.champion
