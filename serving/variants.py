"""A registered model version loaded for serving: ONNX Runtime session + the schema it carries."""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.contract import Schema, encode_features, schema_from_metadata
from tasks.core.registry import alias_version, download_onnx
from tasks.core.runtime import open_onnx, softmax

log = logging.getLogger("torchship.serving")


@dataclass(frozen=True)
class Variant:
    alias: str
    version: str
    schema: Schema
    session: "object"

    def predict(self, rows: pd.DataFrame) -> tuple[list[str], np.ndarray]:
        """Raw rows -> (labels, class probabilities)."""
        probabilities = softmax(self.session.run(None, {"x": encode_features(rows, self.schema)})[0])
        return [self.schema.classes[i] for i in probabilities.argmax(1)], probabilities


def load_variant(client, model_name: str, alias: str, threads: int = 1) -> Variant | None:
    """Load the version behind `alias` (None if the alias is unset). Never unpickles: ONNX only."""
    version = alias_version(client, model_name, alias)
    if version is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        session = open_onnx(download_onnx(client, model_name, version.version, Path(folder)), threads)
    schema = schema_from_metadata(session.get_modelmeta().custom_metadata_map)
    log.info("loaded %s v%s", alias, version.version)
    return Variant(alias=alias, version=str(version.version), schema=schema, session=session)
