"""Errors name their cause: a failure inside ONNX Runtime's quantizer is quoted with the step and the files, and
never blamed on the disk; a full disk still is."""
from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.compress import quantized
from tasks.core.artifacts import ArtifactWriteError, write_atomic
from tasks.variants.quantize import QuantizationFailed, quantize_onnx

pytestmark = pytest.mark.unit


def conflicting_shapes(path: Path) -> Path:
    """A graph ONNX Runtime runs but its quantizer's shape inference refuses, as it refused a real teacher: the
    weight is declared a graph input of another shape than its initializer's ((5, 2) vs (4, 2))."""
    weight = numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 4]),
                                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [5, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_quantizer_failure_quotes_the_library_names_the_step_and_files_and_blames_no_disk(tmp_path):
    source, target = conflicting_shapes(tmp_path / "model.onnx"), tmp_path / "variants" / "model.int8.onnx"
    with pytest.raises(QuantizationFailed) as raised:
        quantize_onnx(source, target)
    message = str(raised.value)
    assert message.startswith("compress: ONNX Runtime's dynamic int8 quantizer"), message
    assert f"failed on {source} while making {target}" in message, message
    assert "ShapeInferenceError" in message and "differ in dimension 0: (4) vs (5)" in message, message
    assert "free" not in message.lower() and "disk is full" not in message, message
    assert not target.exists() and list(target.parent.iterdir()) == []   # no temp file left either


def test_compress_reports_the_variant_it_could_not_quantize_and_drops_an_earlier_runs_file(tmp_path):
    source, target = conflicting_shapes(tmp_path / "model.onnx"), tmp_path / "model.int8.onnx"
    target.write_bytes(b"an earlier teacher's int8 file")
    variants, failed = {}, {}
    quantized("onnx-int8", lambda: quantize_onnx(source, target), target, 1, variants, failed)
    assert variants == {} and "ShapeInferenceError" in failed["onnx-int8"]
    assert not target.exists()


def test_a_full_disk_is_still_named_with_its_free_space(tmp_path):
    def full(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(ArtifactWriteError, match="the disk is full.*MiB free on its disk.*Free space and re-run"):
        write_atomic(tmp_path / "model.onnx", full)


def test_a_writer_error_that_is_not_the_disks_is_quoted_without_blaming_it(tmp_path):
    def refuses(tmp: Path) -> None:
        raise ValueError("the graph has no output named 'probabilities'")

    with pytest.raises(ArtifactWriteError) as raised:
        write_atomic(tmp_path / "model.onnx", refuses)
    assert "ValueError: the graph has no output named 'probabilities'" in str(raised.value)
    assert "free" not in str(raised.value).lower()
