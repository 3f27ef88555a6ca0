"""Errors say their real cause: an object the store returned that is not UTF-8 is not "the store could not be
reached"; a write stopped by a file-size limit (EFBIG, ulimit -f), or failing for another reason, is not "free
space" (only ENOSPC and EDQUOT are); each keeps the original error's type, and its message is quoted with what a
request or a credential could have put there taken out."""
from __future__ import annotations

import contextlib
import errno
import io
import resource
from pathlib import Path

import pytest

from tasks.core.artifacts import ArtifactWriteError, write_atomic
from tasks.core.bucket import BucketError, Location, get_text, list_keys

LOCATION = Location("logs", "serve")
KEY_ID, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


class Store:
    """An S3 client whose calls answer `body` or raise `error`."""

    def __init__(self, body: bytes = b"", error: Exception | None = None):
        self.body, self.error = body, error

    def get_object(self, **_):
        if self.error:
            raise self.error
        return {"Body": io.BytesIO(self.body)}

    def get_paginator(self, _):
        raise self.error


def test_an_object_that_is_not_utf8_is_named_not_blamed_on_the_connection():
    with pytest.raises(BucketError) as raised:
        get_text(Store(b'{"id": 1}\n\xff\xfe'), LOCATION, "serve/segments/1.jsonl")
    message = str(raised.value)
    assert "could not be reached" not in message and "AWS_ENDPOINT_URL" not in message, message
    assert "not UTF-8" in message and "UnicodeDecodeError" in message and "serve/segments/1.jsonl" in message


def test_an_unknown_store_error_keeps_its_type_and_loses_the_secrets_its_message_held(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    leaky = RuntimeError(f"GET https://{KEY_ID}:{SECRET}@store:9000/logs?X-Amz-Signature=0f3a9c&X-Amz-Credential="
                         f"{KEY_ID}%2F20260101 failed: Authorization: Bearer eyJhbGciOi.payload.sig secret={SECRET}")
    with pytest.raises(BucketError) as raised:
        list_keys(Store(error=leaky), LOCATION, "segments")
    message = str(raised.value)
    assert "RuntimeError" in message and "could not be reached" not in message, message
    for secret in (KEY_ID, SECRET, "0f3a9c", "eyJhbGciOi"):
        assert secret not in message, message


def test_a_store_that_cannot_be_reached_is_still_said_so():
    from botocore.exceptions import EndpointConnectionError

    with pytest.raises(BucketError, match="could not be reached"):
        get_text(Store(error=EndpointConnectionError(endpoint_url="http://127.0.0.1:1")), LOCATION, "k")


@contextlib.contextmanager
def file_size_limit(limit: int = 1 << 40):
    """A finite (and harmless) soft limit on file sizes, as under `ulimit -f`, for the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def failing(exc: BaseException):
    def write(tmp: Path) -> None:
        raise exc
    return write


@pytest.mark.parametrize("exc", [OSError(errno.EFBIG, "File too large"), OSError(errno.EIO, "Input/output error"),
                                 ValueError("the graph has no output named 'probabilities'")])
def test_a_write_that_did_not_find_the_disk_full_never_says_free_space(tmp_path, exc):
    with file_size_limit(), pytest.raises(ArtifactWriteError) as raised:
        write_atomic(tmp_path / "model.onnx", failing(exc))
    message = str(raised.value)
    assert "Free space and re-run" not in message and "disk is full" not in message, message
    assert type(exc).__name__ in message or "File too large" in message, message
    if getattr(exc, "errno", None) == errno.EFBIG:
        assert "ulimit -f" in message and "file-size limit" in message, message


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_is_still_named_with_its_free_space(tmp_path, code):
    with pytest.raises(ArtifactWriteError, match="the disk is full, or a quota.*MiB free.*Free space and re-run"):
        write_atomic(tmp_path / "model.onnx", failing(OSError(code, "full")))


def test_a_parquet_read_that_runs_out_of_memory_is_not_called_an_invalid_file(tmp_path, monkeypatch):
    import pandas as pd

    from tasks.core.errors import TorchshipError
    from tasks.modalities.table import files as tables

    path = tmp_path / "rows.parquet"
    pd.DataFrame({"a": [1, 2]}).to_parquet(path)

    def short_of_memory(*args, **kwargs):
        raise MemoryError("malloc of 4294967296 bytes failed")

    monkeypatch.setattr(pd, "read_parquet", short_of_memory)
    with pytest.raises(TorchshipError) as raised:
        tables.read_table(path)
    message = str(raised.value)
    assert "not a valid Parquet file" not in message and "MemoryError" in message and "out of memory" in message
