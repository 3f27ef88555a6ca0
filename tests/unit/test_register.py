"""register against a tracking server that goes away (restarted, down): how long MLflow's client waits for it, which
errors mean "no answer" (never "not registered yet"), which duplicate a retried create leaves is deleted, and what
the step says when the server stays away. The restart itself: tests/integration/test_journey.py, step 4."""
from __future__ import annotations

import os
import random
import socket
from types import SimpleNamespace

import pytest

from tasks.core.env import HTTP_RETRIES_ENV, JOB_ENV, MLFLOW_HTTP_RETRY, http_retry_window_s
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import TrackingParams
from tasks.register import TrackingServerDown, server_down, settle_duplicates
from tasks.registry.read import SHA_TAG, UNFINISHED_TAG, find_version_by_sha, server_unreachable, store_busy


def test_the_retry_window_is_urllib3s_backoff_summed_with_full_jitter(monkeypatch):
    from urllib3.exceptions import NewConnectionError
    from urllib3.util import Retry

    monkeypatch.setattr(random, "random", lambda: 1.0)   # the most jitter each wait may add
    retries = int(MLFLOW_HTTP_RETRY["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
    retry, waited = Retry(total=retries, connect=retries, backoff_factor=1, backoff_jitter=1.0), 0.0
    with pytest.raises(Exception, match="Max retries exceeded"):
        while True:
            retry = retry.increment(method="POST", url="/x", error=NewConnectionError(None, "refused"))
            waited += retry.get_backoff_time()
    assert waited == http_retry_window_s() == 132.0   # about 2 min; MLflow's own default is about 4
    assert MLFLOW_HTTP_RETRY.items() <= JOB_ENV.items()   # deployed runs get it (prefect.yaml: test_env.py)


def refused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]   # closed again: nothing listens there


def test_mlflows_error_for_a_server_that_refuses_reads_as_unreachable_not_as_busy(monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")   # one retry, at once: the real error, no waiting
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{refused_port()}")
    with pytest.raises(Exception) as refused:
        client.search_model_versions("name='m'")
    assert server_unreachable(refused.value) and not store_busy(refused.value)
    with pytest.raises(Exception, match="Max retries exceeded"):   # never "no version of these bytes yet"
        find_version_by_sha(client, "m", "abc")
    from mlflow.exceptions import MlflowException

    missing = MlflowException("Registered Model with name=m not found", error_code="RESOURCE_DOES_NOT_EXIST")
    assert not server_unreachable(missing)
    assert find_version_by_sha(SimpleNamespace(search_model_versions=lambda _: (_ for _ in ()).throw(missing)),
                               "m", "abc") is None


def test_a_retried_create_keeps_the_oldest_version_and_deletes_only_unfinished_unaliased_duplicates():
    pending = {SHA_TAG: "abc", UNFINISHED_TAG: "artifacts logged"}
    versions = [("4", pending, []), ("3", pending, []), ("2", {SHA_TAG: "other"}, ["champion"]),
                ("5", {SHA_TAG: "abc"}, []), ("6", pending, ["challenger"])]
    assert settle_duplicates(versions, "abc") == ("3", ["4"])   # 5 is finished, 6 holds an alias: left as they are
    assert settle_duplicates([("7", pending, [])], "abc") == ("7", [])
    assert settle_duplicates(versions, "new") == (None, [])


def test_a_server_that_stays_away_fails_register_naming_it_the_bound_and_the_way_back(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    params = SimpleNamespace(tracking=TrackingParams(uri="http://127.0.0.1:5000"))
    error = server_down(params, 140.0, RuntimeError("API request to http://127.0.0.1:5000/x failed with exception "
                                                    "Max retries exceeded (Connection refused)"))
    assert isinstance(error, TrackingServerDown) and isinstance(error, TorchshipError)
    said = str(error)
    assert "http://127.0.0.1:5000 did not answer for 132 s" in said and "torchship stack status" in said
    assert UNFINISHED_TAG in said and "finishes that version rather than adding another" in said



def test_a_server_away_through_the_retries_stops_register_and_its_run_closes_with_one_try(tmp_path, monkeypatch):
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import fluent

    from tasks import register

    def away(*_args, **_kwargs):
        raise MlflowException("API request to http://127.0.0.1:5000/x failed with exception Max retries exceeded")

    tried_with, end_run = [], fluent.end_run
    monkeypatch.setattr(register, "register_candidate", away)
    monkeypatch.setattr(fluent, "end_run", lambda status: tried_with.append(os.environ.get(HTTP_RETRIES_ENV))
                        or end_run(status))
    monkeypatch.setenv(HTTP_RETRIES_ENV, "7")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # a store without a database: no migrations to wait for
    params = SimpleNamespace(tracking=TrackingParams(uri=(tmp_path / "runs").as_uri(), artifacts=str(tmp_path)))
    with pytest.raises(TrackingServerDown, match="did not answer for 132 s"):
        register._run_with_retries(params, SimpleNamespace(), None, None)
    assert tried_with == ["0"] and os.environ[HTTP_RETRIES_ENV] == "7"   # closed with one try; the retries back
    assert mlflow.active_run() is None
