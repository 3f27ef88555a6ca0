"""The accepted-batch index shared through the registry (tasks/monitoring/batch_index.py), on two clones that share only
a registry and a DVC remote: a batch accepted on one is pulled by the other, which never saw it; two accepting at
once both land (the registry lock makes read-index, add, push, move-index one step). A SQLite registry stands in
for the tracking server here (its lock is the file lock); the journey test runs the same code on the stack."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from tasks.core import paths
from tasks.core.params_spec import TrackingParams
from tasks.monitoring import batch_index

pytestmark = pytest.mark.integration
MODEL = "batch-index-model"


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True, timeout=60)


def dvc(root: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, check=True, capture_output=True, timeout=120)


@pytest.fixture
def hosts(tmp_path):
    """Two clones of one git remote with one DVC remote folder, and an MLflow client on one shared registry."""
    from mlflow import MlflowClient

    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    dvc(origin, "init", "-q")
    dvc(origin, "remote", "add", "-d", "shared", str(tmp_path / "dvc-remote"))
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "project")
    for host in ("a", "b"):
        git(tmp_path, "clone", "-q", str(origin), f"host-{host}")
    uri = f"sqlite:///{tmp_path / 'registry.db'}"
    return tmp_path / "host-a", tmp_path / "host-b", MlflowClient(uri, uri)


def store(root: Path, name: str):
    def write() -> Path:
        target = root / paths.BATCHES / f"{name}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"x": [1.0], "y": [name]}).to_parquet(target)
        return target
    return write


def batch_files(root: Path) -> list[str]:
    return sorted(path.name for path in (root / paths.BATCHES).glob("*.parquet"))


def test_a_batch_accepted_on_one_host_is_pulled_by_another_and_none_is_lost_when_two_accept_at_once(hosts):
    host_a, host_b, client = hosts
    # the embedded default (a registry file on one machine): snapshotted in this tree only, no shared index
    embedded = TrackingParams(uri=f"sqlite:///{host_a.parent / 'registry.db'}")
    batch_index.keep_batch(embedded, MODEL, store(host_a, "local"), root=host_a)
    assert batch_index.local_snapshot(host_a)["nfiles"] == 1 and batch_index.shared_snapshot(client, MODEL) is None
    (host_a / paths.BATCHES / "local.parquet").unlink()
    assert batch_index.pull_batches(client, MODEL, host_b) == "no accepted batches in the shared index"
    batch_index.publish_batch(client, MODEL, store(host_a, "first"), host_a)
    assert "pulled 1 accepted batch file(s)" in batch_index.pull_batches(client, MODEL, host_b)
    assert batch_files(host_b) == ["first.parquet"]
    assert batch_index.local_snapshot(host_b) == batch_index.shared_snapshot(client, MODEL)
    assert "up to date" in batch_index.pull_batches(client, MODEL, host_b)
    # host B's batch goes on top of the index, not over it; host A then pulls both
    batch_index.publish_batch(client, MODEL, store(host_b, "second"), host_b)
    batch_index.pull_batches(client, MODEL, host_a)
    assert batch_files(host_a) == ["first.parquet", "second.parquet"]
    assert batch_index.shared_snapshot(client, MODEL)["nfiles"] == 2
    # one test, not two: a second fixture would cost a second registry's migrations (seconds on a busy box)
    two_hosts_accepting_at_once_lose_neither_batch(host_a, host_b, client)


def two_hosts_accepting_at_once_lose_neither_batch(host_a: Path, host_b: Path, client) -> None:
    failures = []

    def accept(root: Path, name: str) -> None:
        try:
            batch_index.publish_batch(client, MODEL, store(root, name), root)
        except Exception as exc:   # reported by the assertion below, not lost in the thread
            failures.append(exc)

    threads = [threading.Thread(target=accept, args=pair) for pair in ((host_a, "third"), (host_b, "fourth"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures
    assert batch_index.shared_snapshot(client, MODEL)["nfiles"] == 4
    for host in (host_a, host_b):
        batch_index.pull_batches(client, MODEL, host)
        assert batch_files(host) == ["first.parquet", "fourth.parquet", "second.parquet", "third.parquet"]
