"""A registered model version loaded for serving: ONNX Runtime session + the schema it carries."""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.contract import Schema, encode_features, schema_from_metadata

log = logging.getLogger("torchship.serving")


@dataclass(frozen=True)
class Variant:
    alias: str
    version: str
    schema: Schema
    session: "object"

    def predict(self, rows: pd.DataFrame) -> tuple[list[str], np.ndarray]:
        """Raw rows -> (labels, class probabilities)."""
        logits = self.session.run(None, {"x": encode_features(rows, self.schema)})[0]
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        return [self.schema.classes[i] for i in probabilities.argmax(1)], probabilities


def open_onnx(path: Path, threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def load_variant(client, model_name: str, alias: str) -> Variant | None:
    """Load the version behind `alias` (None if the alias is unset). Never unpickles: ONNX only."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(model_name, alias)
    except MlflowException:
        return None
    with tempfile.TemporaryDirectory() as folder:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{version.version}",
                                                         dst_path=folder))
        session = open_onnx(local / "model.onnx")
    schema = schema_from_metadata(session.get_modelmeta().custom_metadata_map)
    log.info("loaded %s v%s", alias, version.version)
    return Variant(alias=alias, version=str(version.version), schema=schema, session=session)
