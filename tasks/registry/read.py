"""Reading the MLflow registry: alias look-ups, tags, and artifact downloads. Nothing here writes, so the
service may use it; alias moves and tags live in `tasks.registry.write`."""
from __future__ import annotations

import contextlib
import hashlib
import re
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from tasks.core.errors import TorchshipError
from tasks.core.params_spec import TrackingParams
from tasks.core.runtime import open_onnx
from tasks.core.schema_spec import Schema, schema_from_metadata

CHAMPION, CHALLENGER = "champion", "challenger"
SHA_TAG = "artifact_sha256"
# On a version from its creation until its tags, model card and aliases are written: a retry or re-run that finds
# its bytes finishes it (a version registered by hand, or finished, carries no such tag and is left as it is).
UNFINISHED_TAG = "register_unfinished"


def store_busy(exc: BaseException) -> bool:
    """The store could not answer now (a SQLite database locked by another process past MLflow's 20 s busy
    timeout, a dropped connection): worth retrying, and never to be read as "no such model" or "no alias"."""
    return getattr(exc, "error_code", None) == "TEMPORARILY_UNAVAILABLE" or "database is locked" in str(exc)


# What MLflow's client raises once its own retries of a request (MLFLOW_HTTP_RETRY, tasks/core/env.py) are spent on
# a tracking server that refuses connections, drops them, keeps answering 5xx, or does not answer in time.
UNREACHABLE_MARKS = ("Max retries exceeded", "failed with timeout exception", "Connection refused",
                     "Connection aborted", "RemoteDisconnected")


def server_unreachable(exc: BaseException) -> bool:
    """The tracking server did not answer through every retry of MLflow's client (restarting for longer than the
    retry window, down, or cut off)."""
    return any(mark in str(exc) for mark in UNREACHABLE_MARKS)


def cannot_answer(exc: BaseException) -> bool:
    """The store is busy or the server unreachable: an error to retry or report, never an empty answer."""
    return store_busy(exc) or server_unreachable(exc)


def registry_client(tracking: TrackingParams) -> object:
    """An MlflowClient on the configured store (no global MLflow state is touched)."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking.resolved_uri(), registry_uri=tracking.resolved_uri())


def alias_version(client, name: str, alias: str):
    """The model version holding `alias`, or None (also when the model is not registered yet)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if cannot_answer(exc):   # a locked or gone store is not "no champion": that would promote past the canary
            raise
        return None


def aliases(client, name: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return {k: str(v) for k, v in client.get_registered_model(name).aliases.items()}
    except MlflowException as exc:
        if cannot_answer(exc):
            raise
        return {}


def model_version(client, name: str, version: str | int):
    """One registered version, or an error saying how to see which exist."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException:
        raise TorchshipError(f"{name} has no version {version}: see `torchship status`.") from None


def find_version_by_sha(client, name: str, sha256: str):
    """An existing version registered from exactly these bytes, if any."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException as exc:
        if cannot_answer(exc):   # "not registered yet" would register the same bytes twice
            raise
        return None
    return next((v for v in versions if v.tags.get(SHA_TAG) == sha256), None)


def versions_tagged(client, name: str, key: str, value: str) -> set[str]:
    """Numbers of the versions whose tag `key` is `value` (e.g. trigger=retrain)."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return set()
    return {str(v.version) for v in versions if v.tags.get(key) == value}


class ArtifactRefused(TorchshipError):
    """A version's ONNX bytes do not hash to its `artifact_sha256` tag (tampered or corrupted), or it has none; or
    its artifact location read from the registry climbs out of its folder."""


def refuse_climbing(uri: str, what: str) -> str:
    """`uri`, unless it has a `..` segment: a location read from the registry (anyone who can write a version or an
    experiment sets it) must not reach outside the artifact store it names. MLflow itself accepts such sources."""
    if ".." in re.split(r"[/\\]", unquote(urlparse(uri).path)):
        raise ArtifactRefused(f"{what}: its artifact location {uri} climbs out of its folder ('..'), so it is refused. "
                              "Register the model again (torchship run) rather than pointing a version at files.")
    return uri


def inside(folder: Path, path: Path, what: str) -> Path:
    """`path`, once it is known to resolve inside `folder` (a link or a crafted name must not lead out)."""
    if not Path(path).resolve().is_relative_to(Path(folder).resolve()):
        raise ArtifactRefused(f"{what}: the downloaded file {path} lies outside the download folder {folder}; refused.")
    return Path(path)


def download_onnx(client, name: str, version: str | int, destination: Path) -> Path:
    """Fetch a version's ONNX file (the MLflow ONNX flavor folder holds model.onnx) into `destination`,
    through `client` alone: a `models:/` URI would be resolved against MLflow's process-wide registry URI,
    which a service built from params never sets. A location with `..` is refused (ArtifactRefused)."""
    from mlflow.artifacts import download_artifacts

    what = f"{name} v{version}"
    source = refuse_climbing(client.get_model_version_download_uri(name, str(version)), what)
    folder = Path(download_artifacts(artifact_uri=source, dst_path=str(destination), tracking_uri=client.tracking_uri))
    return inside(destination, folder / "model.onnx", what)


def inline_external_data(path: Path) -> bytes:
    """A model saved with its tensors in side files, as the one file it was before (the bytes register hashed):
    the tensors loaded back inline and their data_location mark cleared (onnx sets it when it loads them)."""
    import onnx

    model = onnx.load(str(path))

    def tensors(graph):
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                for sub in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
                    yield from tensors(sub)

    for tensor in tensors(model.graph):
        tensor.ClearField("data_location")
    return model.SerializeToString()


def verified_onnx(client, name: str, version: str | int) -> bytes:
    """A version's ONNX bytes, only if their sha256 is the one its `artifact_sha256` tag recorded at register
    time: a file changed in the artifact store afterwards (or a version registered without the tag) is refused."""
    expected = model_version(client, name, version).tags.get(SHA_TAG)
    with tempfile.TemporaryDirectory() as folder:
        path = download_onnx(client, name, version, Path(folder))
        payload = path.read_bytes()
        if hashlib.sha256(payload).hexdigest() != expected:   # logged with MLflow's default: weights in a side file?
            with contextlib.suppress(Exception):   # not even an ONNX file: refused below as it is
                payload = inline_external_data(path)
    actual = hashlib.sha256(payload).hexdigest()
    if expected is None:
        raise ArtifactRefused(f"{name} v{version} has no {SHA_TAG} tag, so its artifact cannot be checked (torchship's "
                              f"register step sets it; tag a hand-registered version with its model.onnx's sha256)")
    if actual != expected:
        raise ArtifactRefused(f"{name} v{version}: model.onnx has sha256 {actual[:12]}..., its {SHA_TAG} tag says "
                              f"{expected[:12]}...: the artifact was changed after it was registered")
    return payload


def open_version(client, name: str, version: str | int, threads: int) -> tuple[object, Schema]:
    """A registered version as an ONNX Runtime session and the schema it carries, from the verified bytes (what
    was hashed is what is loaded). Never unpickles: ONNX only."""
    session = open_onnx(verified_onnx(client, name, version), threads)
    return session, schema_from_metadata(session.get_modelmeta().custom_metadata_map)
