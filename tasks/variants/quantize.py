"""int8 quantisation of ONNX files (ONNX Runtime dynamic, and static QDQ calibrated on training rows)."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tasks.core.artifacts import disk_may_be_why, write_atomic
from tasks.core.errors import TorchshipError


class QuantizationFailed(TorchshipError):
    """ONNX Runtime's quantizer raised on a file: its own error, quoted with the step and the files."""


@contextlib.contextmanager
def quantizer_errors(kind: str, source: Path, target: Path, step: str) -> Iterator[None]:
    """The quantizer's own error as QuantizationFailed, naming the step, both files and the library's words; an
    error the disk may have caused goes on as it is (write_atomic then says so, with the free space)."""
    try:
        yield
    except Exception as exc:
        if disk_may_be_why(exc, target):
            raise
        from importlib.metadata import version

        raise QuantizationFailed(
            f"{step}: ONNX Runtime's {kind} quantizer (onnxruntime {version('onnxruntime')}) failed on {source} while "
            f"making {target}: {type(exc).__name__}: {exc} (the library's own error: no write was "
            "refused)") from exc


def _keep_metadata(source: Path, tmp: Path) -> None:
    import onnx

    proto, original = onnx.load(str(tmp)), onnx.load(str(source))
    del proto.metadata_props[:]
    proto.metadata_props.extend(original.metadata_props)
    onnx.save(proto, str(tmp))


@contextlib.contextmanager
def _quiet_root_logger():
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # ORT's "consider pre-processing" hint is noise here
    try:
        yield
    finally:
        root.setLevel(level)


# Variants made by quantize_onnx: their activations are quantised per call over the whole batch, so one row's
# answer moves with the rows batched beside it. The service micro-batches concurrent requests, so these are
# profiled and reported but never served (a user's answer must not depend on another user's rows).
BATCH_DEPENDENT = {"onnx-int8": "dynamic int8", "student-onnx-int8": "dynamic int8"}


def quantize_onnx(source: Path, target: Path, step: str = "compress") -> None:
    """ONNX Runtime dynamic int8 (weights int8, activations quantised per call); metadata kept. The quantizer's own
    failure raises QuantizationFailed, naming `step` and the files."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(tmp: Path) -> None:
        with _quiet_root_logger(), quantizer_errors("dynamic int8", source, target, step):
            quantize_dynamic(str(source), str(tmp), weight_type=QuantType.QInt8)
        _keep_metadata(source, tmp)

    write_atomic(target, write)


def quantize_onnx_static(source: Path, target: Path, calibration: np.ndarray, step: str = "compress") -> None:
    """ONNX Runtime static int8 (QDQ) of the matrix products and convolutions, weights per output channel,
    calibrated on raw training rows (or images); failures as quantize_onnx's."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Rows(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(np.array_split(calibration, max(1, len(calibration) // 256)))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"x": batch}

    def write(tmp: Path) -> None:
        with _quiet_root_logger(), quantizer_errors("static int8", source, target, step):
            quantize_static(str(source), str(tmp), Rows(), quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=["MatMul", "Gemm", "Conv"], per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        _keep_metadata(source, tmp)

    write_atomic(target, write)
