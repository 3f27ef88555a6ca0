"""The accepted-batch index's pure parts: a `.dvc` file <-> the snapshot the registry tag holds, and which
registries make the index shared."""
from __future__ import annotations

from tasks.core.params_spec import TrackingParams
from tasks.monitoring.batch_index import dvc_file_text, is_shared, shared_snapshot, snapshot_of

DVC_FILE = """outs:
- md5: 3f1c8d2e0a9b4c5d6e7f8091a2b3c4d5.dir
  size: 1234
  nfiles: 2
  hash: md5
  path: batches
"""


def test_a_dvc_file_and_its_snapshot_round_trip():
    snapshot = snapshot_of(DVC_FILE)
    assert snapshot == {"md5": "3f1c8d2e0a9b4c5d6e7f8091a2b3c4d5.dir", "size": 1234, "nfiles": 2, "hash": "md5",
                        "path": "batches"}
    assert snapshot_of(dvc_file_text(snapshot)) == snapshot


def test_an_empty_or_foreign_file_is_no_snapshot():
    assert snapshot_of("") is None
    assert snapshot_of("outs:\n- path: batches\n") is None


def test_the_index_is_shared_only_when_the_registry_is_one_every_machine_reaches():
    assert is_shared(TrackingParams(uri="http://mlflow.internal:5000"))
    assert is_shared(TrackingParams(uri="postgresql://db/mlflow"))
    assert not is_shared(TrackingParams(uri="sqlite:///mlflow/mlflow.db"))
    assert not is_shared(TrackingParams(uri="file:./mlruns"))


class Registry:
    """A registry client whose model read fails with `error`."""

    def __init__(self, error: Exception):
        self.error = error

    def get_registered_model(self, name):
        raise self.error


def test_a_store_that_cannot_answer_is_not_read_as_no_index():
    """A busy store read as "no accepted batches" would train the run without them."""
    import pytest
    from mlflow.exceptions import MlflowException

    busy = MlflowException("database is locked", error_code="TEMPORARILY_UNAVAILABLE")
    with pytest.raises(MlflowException):
        shared_snapshot(Registry(busy), "m")
    assert shared_snapshot(Registry(MlflowException("no such model", error_code="RESOURCE_DOES_NOT_EXIST")),
                           "m") is None
