"""The MLflow store locked by another process during register: a real `BEGIN EXCLUSIVE` on the SQLite database, held
by a separate process, while the register step runs in its own process on the session's pipeline outputs (against
a store of its own, so the session's registry is untouched).

1. Locked mid-step (the version and its artifacts written, its tags not yet) for longer than every retry: the step
   fails with StoreBusy, naming the store and what to do; the version it left has its artifacts and its sha tag.
2. Run again (in the same process: one interpreter start less) with the lock taken before it starts and released
   only once the step has said it is retrying: the step waits with backoff and completes, finishing that same
   version (no second version of the same bytes; tests/reliability/test_kill_ladder.py re-runs in a new process).

The child shortens MLflow's 20 s SQLite busy timeout and the step's backoff, so the test waits seconds, not minutes;
the code paths are the ones a real lock takes."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.core.params_spec import TrackingParams
from tasks.registry.read import SHA_TAG, aliases, registry_client
from tests.helpers.register_child import result, start_register_child, wait_for

pytestmark = pytest.mark.reliability
NAME = "locked-store"

LOCKER = textwrap.dedent("""
    import sqlite3, sys, time
    from pathlib import Path
    connection = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
    connection.execute("BEGIN EXCLUSIVE")
    Path(sys.argv[2]).touch()
    while not Path(sys.argv[3]).exists():
        time.sleep(0.02)
    connection.execute("COMMIT")
""")


def lock(db: Path, folder: Path, release: Path) -> subprocess.Popen:
    """Another process holding the database's write lock until `release` exists."""
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(folder / "locked"), str(release)])
    deadline = time.monotonic() + 60
    while not (folder / "locked").exists():
        assert locker.poll() is None and time.monotonic() < deadline, "the locker could not lock the database"
        time.sleep(0.02)
    return locker


@pytest.mark.timeout(600)
def test_register_under_a_locked_store_fails_clearly_then_retries_and_finishes_the_same_version(tiny_pipeline,
                                                                                                 tmp_path):
    project, _ = tiny_pipeline
    store = tmp_path / "store"
    store.mkdir()
    client = registry_client(TrackingParams(uri=f"sqlite:///{store / 'mlflow.db'}"))
    client.search_registered_models()   # creates the database, so the locker has something to lock
    sha = hashlib.sha256((project.root / "data/profile/model.onnx").read_bytes()).hexdigest()

    log = tmp_path / "register.log"
    # 1. locked mid-step, for longer than every retry
    child = start_register_child(project, store, sha, NAME, {"uri": f"sqlite:///{store}/mlflow.db",
                                                            "artifacts": f"{store}/artifacts"}, "locked", log,
                                 project.env(), sqlite_busy_ms=300, retry_delays_s=(0.2, 0.4, 0.8))
    try:
        release = tmp_path / "release-1"
        locker = lock(store / "mlflow.db", store, release)
        try:
            outcome = result(1, log, child)
        finally:
            release.touch()
            locker.wait(timeout=60)
        assert "StoreBusy" in outcome, outcome
        message = outcome["StoreBusy"]
        assert str(store / "mlflow.db") in message and "stayed busy through 4 attempts" in message, message
        assert "re-run `torchship run`" in message and "not registered twice" in message, message
        [left] = client.search_model_versions(f"name='{NAME}'")
        assert left.tags.get(SHA_TAG) == sha, left.tags   # never a version without its tag...
        artifacts = Path(client.get_model_version_download_uri(NAME, left.version).removeprefix("file://"))
        assert (artifacts / "model.onnx").read_bytes() == (project.root / "data/profile/model.onnx").read_bytes()
        assert "register_unfinished" in left.tags and aliases(client, NAME) == {}   # ...and, unfinished, no alias

        # 2. locked again before the step starts; released once the step says it is retrying
        release = tmp_path / "release-2"
        (store / "locked").unlink()
        locker = lock(store / "mlflow.db", store, release)
        (store / "round-2").touch()
        try:
            wait_for("the MLflow store is busy", log, child, after="ROUND 2")
        finally:
            release.touch()
            locker.wait(timeout=60)
        outcome = result(2, log, child)
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert "registered" in outcome, outcome
    assert "SQLAlchemy database error" not in log.read_text()   # each retry is one line, not MLflow's traceback
    [version] = client.search_model_versions(f"name='{NAME}'")
    assert version.version == left.version and outcome["registered"]["version"] == str(left.version)
    assert version.description and version.tags.get(SHA_TAG) == sha and "lineage_files" in version.tags
    assert "register_unfinished" not in version.tags
    assert aliases(client, NAME) == {"champion": str(left.version)}
