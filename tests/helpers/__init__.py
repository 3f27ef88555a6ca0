"""Helpers the tests share: a free port, and a snapshot of the files and registry a failure must not touch."""
from __future__ import annotations

import hashlib

import pandas as pd

from tasks.core.procs import free_port

GUARDED_FILES = ("params.yaml", "data/prepare/train.parquet", "data/train/model.pt", "data/export/model.onnx")


def snapshot(project, model: str, files: tuple[str, ...] = GUARDED_FILES) -> tuple[dict, dict]:
    """sha256 of the last good artifacts and the registry as another process sees it."""
    hashes = {f: hashlib.sha256((project.root / f).read_bytes()).hexdigest() for f in files}
    return hashes, project.registry(model)


def holdout_rows(project, n: int = 1, target: str = "churned") -> list[dict]:
    """Raw holdout rows as a client sends them (features only, missing values as null)."""
    frame = pd.read_parquet(project.root / "data/prepare/holdout.parquet").drop(columns=[target]).head(n)
    return [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in frame.to_dict("records")]


def champion_bytes(model: str) -> str:
    """Python code (for `promote_by_hand`) giving the current champion's ONNX model."""
    return f"onnx.load(mlflow.artifacts.download_artifacts('models:/{model}@champion') + '/model.onnx')"


def promote_by_hand(project, model: str, model_code: str) -> str:
    """In another process, as a reviewer in the MLflow UI would: register an ONNX model as a new version and
    move `champion` to it. `model_code` is a Python expression giving an onnx.ModelProto. Returns the version."""
    return project.python(
        "import mlflow, onnx\nfrom mlflow import MlflowClient\n"
        "mlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\nmlflow.set_experiment('torchship')\n"
        f"info = mlflow.onnx.log_model({model_code}, name='model', registered_model_name='{model}')\n"
        f"MlflowClient().set_registered_model_alias('{model}', 'champion', info.registered_model_version)\n"
        "print(info.registered_model_version)\n").strip().splitlines()[-1]


__all__ = ["GUARDED_FILES", "champion_bytes", "free_port", "holdout_rows", "promote_by_hand", "snapshot"]
