"""Helpers the tests share: a free port, and a snapshot of the files and registry a failure must not touch."""
from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from tasks.core.procs import free_port

GUARDED_FILES = ("params.yaml", "data/prepare/train.parquet", "data/train/model.pt", "data/export/model.onnx")


def snapshot(project, model: str, files: tuple[str, ...] = GUARDED_FILES) -> tuple[dict, dict]:
    """sha256 of the last good artifacts and the registry as another process sees it."""
    hashes = {f: hashlib.sha256((project.root / f).read_bytes()).hexdigest() for f in files}
    return hashes, project.registry(model)


def uncached_outputs() -> list[str]:
    """What dvc.yaml tells DVC not to cache (it cannot check these out again): metrics, plots, resume state."""
    from tasks.stages.stage_list import entry_path, read_dvc_stages

    return [entry_path(entry) for stage in read_dvc_stages(REPO).values() for key in ("outs", "metrics", "plots")
            for entry in stage.get(key, [])
            if isinstance(entry, dict) and next(iter(entry.values())).get("cache") is False]


REPO = Path(__file__).resolve().parents[2]
# What DVC does not cache, and params and the lock beside them; the folders among them: resume state.
UNCACHED = ("params.yaml", "dvc.lock", *(path for path in uncached_outputs() if Path(path).suffix))
UNCACHED_FOLDERS = tuple(path for path in uncached_outputs() if not Path(path).suffix)
# The closed loop's state: served rows, feedback, drift reports, decisions, retrain batches and their snapshot.
LOOP_STATE = ("data/serve", "data/monitor", "data/batches", "data/batches.dvc")


@contextlib.contextmanager
def workspace_restored(project, model: str) -> Iterator[None]:
    """For a test that runs the pipeline with other params on a shared project: afterwards the params,
    stage outputs (checked out of DVC's cache) and the registry's aliases are as they were."""
    saved = {name: (project.root / name).read_bytes() for name in (*UNCACHED, "data/.gitignore")
             if (project.root / name).exists()}
    loop_before = {name for name in LOOP_STATE if (project.root / name).exists()}
    aliases = project.registry(model)["aliases"]
    folders = Path(tempfile.mkdtemp(prefix="torchship-test-"))
    for name in UNCACHED_FOLDERS:
        shutil.copytree(project.root / name, folders / name)
    try:
        yield
    finally:
        for name, content in saved.items():
            (project.root / name).write_bytes(content)
        for name in set(LOOP_STATE) - loop_before:
            path = project.root / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        for name in UNCACHED_FOLDERS:
            shutil.rmtree(project.root / name, ignore_errors=True)
            shutil.copytree(folders / name, project.root / name)
        shutil.rmtree(folders)
        subprocess.run([sys.executable, "-m", "dvc", "checkout", "--force", "--quiet"], cwd=project.root,
                       capture_output=True, check=True, timeout=300)
        put_aliases_back(project_registry(project), model, aliases)


# The session's first run proves compile, the dynamo exporter and the student: a later full run on its project
# that tests something else leaves the three slow parts out.
LIGHT_RUN = ("export.compile=false", "export.onnx_exporter=legacy", "distill.enabled=false")


def light_run_flags() -> list[str]:
    """LIGHT_RUN as `torchship run` flags."""
    return [flag for setting in LIGHT_RUN for flag in ("--set", setting)]


def project_registry(project):
    """An MLflow client on the project's registry (its SQLite file)."""
    from tasks.core.params_spec import TrackingParams
    from tasks.registry.read import registry_client

    return registry_client(TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"))


def put_aliases_back(client, model: str, aliases: dict[str, str]) -> None:
    for alias in set(client.get_registered_model(model).aliases) - set(aliases):
        client.delete_registered_model_alias(model, alias)
    for alias, version in aliases.items():
        client.set_registered_model_alias(model, alias, version)


@contextlib.contextmanager
def registry_restored(client, model: str) -> Iterator[None]:
    """Afterwards the model's aliases, its versions (none added) and their tags are as they were."""
    aliases = {alias: str(version) for alias, version in client.get_registered_model(model).aliases.items()}
    versions = {v.version: dict(v.tags) for v in client.search_model_versions(f"name='{model}'")}
    try:
        yield
    finally:
        put_aliases_back(client, model, aliases)
        for version in client.search_model_versions(f"name='{model}'"):
            if version.version not in versions:
                client.delete_model_version(model, version.version)
                continue
            for key in set(version.tags) - set(versions[version.version]):
                client.delete_model_version_tag(model, version.version, key)
            for key, value in versions[version.version].items():
                client.set_model_version_tag(model, version.version, key, value)


def holdout_rows(project, n: int = 1, target: str = "churned") -> list[dict]:
    """Raw holdout rows as a client sends them (features only, missing values as null)."""
    frame = pd.read_parquet(project.root / "data/prepare/holdout.parquet").drop(columns=[target]).head(n)
    return [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in frame.to_dict("records")]


def champion_bytes(model: str) -> str:
    """Python code (for `promote_by_hand`) giving the current champion's ONNX model."""
    return f"onnx.load(mlflow.artifacts.download_artifacts('models:/{model}@champion') + '/model.onnx')"


def register_by_hand(project, model: str, model_code: str, alias: str | None = "champion") -> str:
    """In another process, as a reviewer in the MLflow UI would: register an ONNX model as a new version (one file,
    tagged with its sha256, as torchship's register step does: the service checks the artifact against the tag
    before it loads it) and move `alias` to it (None: no alias). `model_code` is a Python expression giving an
    onnx.ModelProto. Returns the version."""
    move = f"c.set_registered_model_alias('{model}', '{alias}', v)\n" if alias else ""
    return project.python(
        "import hashlib, mlflow, onnx\nfrom mlflow import MlflowClient\n"
        "mlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\nmlflow.set_experiment('torchship')\n"
        "c = MlflowClient()\n"
        f"model = {model_code}\nsha = hashlib.sha256(model.SerializeToString()).hexdigest()\n"
        f"info = mlflow.onnx.log_model(model, name='model', registered_model_name='{model}', "
        "save_as_external_data=False)\n"
        "v = info.registered_model_version\n"
        f"c.set_model_version_tag('{model}', v, 'artifact_sha256', sha)\n"
        + move + "print(v)\n").strip().splitlines()[-1]


def promote_by_hand(project, model: str, model_code: str) -> str:
    """register_by_hand and move `champion` to the new version."""
    return register_by_hand(project, model, model_code, alias="champion")


__all__ = ["GUARDED_FILES", "champion_bytes", "dvc_clean", "free_port", "holdout_rows", "promote_by_hand",
           "register_by_hand", "snapshot", "workspace_restored"]


def dvc_clean(status: str) -> bool:
    """`dvc status` has nothing to re-run: only the `source` stage, which DVC always runs (it re-hashes the
    source so an edited file is seen; dvc.yaml), is listed, as 'always changed'."""
    return "up to date" in status or [line.strip() for line in status.splitlines() if line.strip()] == [
        "source:", "always changed"]


def linear_raw_graph(weights, schema, metadata: dict[str, str] | None = None):
    """A composed raw-input graph (one input per feature column, the schema and `metadata` in its metadata) over a
    bare linear model `x @ weights` of the encoded columns: a served model small enough to reason about by hand."""
    from onnx import TensorProto, helper, numpy_helper

    from tasks.modalities.table.graph import compose_raw_model

    inputs, classes = weights.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
                              initializer=[numpy_helper.from_array(weights.astype("float32"), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    helper.set_model_props(model, {"torchship.schema": schema.model_dump_json(), **(metadata or {})})
    return compose_raw_model(model, schema)
