"""tasks/registry/read.py verified_onnx: a version's artifact is served only if it hashes to the version's
artifact_sha256 tag; a changed file or a missing tag is refused; a version MLflow stored with its weights in a
side file (its default, before register stored one file) is checked as the one file it was registered from."""
from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.registry.read import SHA_TAG, ArtifactRefused, verified_onnx


def model_bytes() -> bytes:
    weights = numpy_helper.from_array(np.arange(600, dtype=np.float32).reshape(20, 30), "w")   # over 1 KiB: a side file
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 30])], initializer=[weights])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


class Registry:
    """The two calls verified_onnx makes of an MLflow client, over a local artifact folder."""

    def __init__(self, folder: Path, tags: dict):
        self.folder, self.tags, self.tracking_uri = folder, tags, None

    def get_model_version(self, name, version):
        return SimpleNamespace(tags=self.tags)

    def get_model_version_download_uri(self, name, version):
        return self.folder.as_uri()


def stored(tmp_path, payload: bytes, side_file: bool = False) -> Path:
    folder = tmp_path / "artifacts"
    folder.mkdir()
    if side_file:
        onnx.save_model(onnx.load_from_string(payload), folder / "model.onnx", save_as_external_data=True)
        assert len(list(folder.iterdir())) == 2
    else:
        (folder / "model.onnx").write_bytes(payload)
    return folder


@pytest.mark.parametrize("side_file", [False, True])
def test_the_registered_bytes_are_served_as_registered(tmp_path, side_file):
    payload = model_bytes()
    folder = stored(tmp_path, payload, side_file)
    assert verified_onnx(Registry(folder, {SHA_TAG: hashlib.sha256(payload).hexdigest()}), "m", 1) == payload


def test_a_changed_artifact_is_refused(tmp_path):
    payload = model_bytes()
    folder = stored(tmp_path, payload)
    changed = onnx.load_from_string(payload)
    changed.doc_string = "changed after registration"
    onnx.save(changed, folder / "model.onnx")
    with pytest.raises(ArtifactRefused, match="changed after it was registered"):
        verified_onnx(Registry(folder, {SHA_TAG: hashlib.sha256(payload).hexdigest()}), "m", 1)


def test_a_version_without_the_tag_is_refused(tmp_path):
    with pytest.raises(ArtifactRefused, match=f"no {SHA_TAG} tag"):
        verified_onnx(Registry(stored(tmp_path, model_bytes()), {}), "m", 1)


def test_an_artifact_that_is_no_onnx_file_is_refused(tmp_path):
    payload = model_bytes()
    folder = stored(tmp_path, payload)
    (folder / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ArtifactRefused, match="changed after it was registered"):
        verified_onnx(Registry(folder, {SHA_TAG: hashlib.sha256(payload).hexdigest()}), "m", 1)
