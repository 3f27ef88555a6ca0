"""The tracking server gone during register for longer than MLflow's client retries a request: the real register step
in its own process, on the session's pipeline outputs, against the team stack's `mlflow server` (basic auth,
PostgreSQL, artifacts proxied to the bucket). A restart inside the window is the journey's step 4
(tests/integration/test_journey.py).

1. The server is stopped once the version exists and before its tags are written: the step fails with
   TrackingServerDown, naming the server, the bound and the way back; the version it created is marked with
   `register_unfinished` (no alias).
2. The server started again (`torchship stack up`), the step run again in the same process finishes that same
   version: exactly one version, finished, champion.

The child shortens the client's retries (3 instead of 7: a window of 8 s instead of 132 s), so the test waits seconds;
the code paths are the ones a longer outage takes. Run it alone with `pytest -m stack`."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tasks.core.env import HTTP_RETRIES_ENV
from tasks.core.registry import UNFINISHED_TAG
from tasks.ops.stack import stack_down
from tasks.ops.stack_state import StackPaths, StackState, stop_group
from tests.conftest import BIN
from tests.helpers.stack import evaluated, mlflow_http, require_parts, stack_cli

pytestmark = [pytest.mark.reliability, pytest.mark.stack]
NAME = "server-down"

REGISTER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from mlflow import MlflowClient
    from tasks import register
    from tasks.config import load_params
    from tasks.core.gate import GateResult
    from tasks.core.verdicts import Blessing, BlessOutcome
    folder, sha, name, uri = sys.argv[1:5]
    original = MlflowClient.set_model_version_tag
    def paused(self, *args, **kwargs):   # the version exists, its tags do not: tell the test, wait for the stop
        Path(folder, "at-tags").touch()
        while not Path(folder, "stopped").exists():
            time.sleep(0.02)
        MlflowClient.set_model_version_tag = original
        return original(self, *args, **kwargs)
    MlflowClient.set_model_version_tag = paused
    params = load_params("params.yaml")
    params = params.model_copy(update={"tracking": params.tracking.model_copy(update={
        "uri": uri, "artifacts": None, "experiment": name})})
    blessing = Blessing(gate=GateResult.decide("bless", []), outcome=BlessOutcome.FIRST_MODEL, model_name=name,
                        candidate_path="data/profile/model.onnx", candidate_sha256=sha,
                        candidate_metrics={"f1_macro": 0.5})
    for round in (1, 2):
        if round == 2:
            while not Path(folder, "round-2").exists():
                time.sleep(0.02)
        try:
            outcome = {"registered": register.run(params, blessing).model_dump()}
        except register.TrackingServerDown as exc:
            outcome = {"down": str(exc)}
        print(f"RESULT {round} " + json.dumps(outcome), flush=True)
""")


@pytest.fixture(scope="module")
def stack():
    """A stack without workers, taken down and removed on every way out."""
    require_parts()
    paths = StackPaths(Path(tempfile.mkdtemp(prefix="torchship-down-", dir="/tmp")))   # PostgreSQL traverses it
    paths.root.chmod(0o711)
    try:
        stack_cli(paths, "up", "--workers", "0")
        yield paths, evaluated(stack_cli(paths, "env"))
    finally:
        with contextlib.suppress(Exception):
            stack_down(paths, os.environ)
        shutil.rmtree(paths.root, ignore_errors=True)


def result(round: int, log: Path, child: subprocess.Popen) -> dict:
    """The child's outcome of `round`, once it has printed it."""
    deadline = time.monotonic() + 300
    while f"RESULT {round} " not in (output := log.read_text()):
        assert child.poll() is None and time.monotonic() < deadline, output[-3000:]
        time.sleep(0.1)
    line = next(x for x in output.splitlines() if x.startswith(f"RESULT {round} "))
    return json.loads(line[len(f"RESULT {round} "):])


def versions(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """The model's versions on the server, with their tags."""
    with mlflow_http(env) as mlflow:
        found = mlflow.get("/model-versions/search", params={"filter": f"name='{NAME}'"}).json()
    return {v["version"]: {t["key"]: t["value"] for t in v.get("tags", [])} for v in found.get("model_versions", [])}


@pytest.mark.timeout(900)
def test_register_fails_clearly_while_the_server_is_away_then_finishes_the_same_version(tiny_pipeline, stack,
                                                                                         tmp_path):
    project, _ = tiny_pipeline
    paths, env = stack
    sha = hashlib.sha256((project.root / "data/profile/model.onnx").read_bytes()).hexdigest()
    log = tmp_path / "register.log"
    with log.open("w") as handle:
        child = subprocess.Popen([str(BIN / "python"), "-c", REGISTER, str(tmp_path), sha, NAME,
                                  env["MLFLOW_TRACKING_URI"]], cwd=project.root, stdout=handle,
                                 stderr=subprocess.STDOUT, text=True,
                                 env={**project.env(), **env, HTTP_RETRIES_ENV: "3"})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "at-tags").exists():
            assert child.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        state = StackState.load(paths)
        stop_group(state.processes.pop("mlflow"), 20)   # the server goes, for longer than the client retries
        state.save(paths)
        (tmp_path / "stopped").touch()
        outcome = result(1, log, child)
        assert "down" in outcome, outcome
        said = outcome["down"]
        assert f"{env['MLFLOW_TRACKING_URI']} did not answer for 8 s" in said and UNFINISHED_TAG in said, said
        began = time.monotonic()
        stack_cli(paths, "up", "--workers", "0")   # starts what is not running: the MLflow server
        print(f"\nthe MLflow server back in {time.monotonic() - began:.1f} s")
        assert list(versions(env)) == ["1"] and UNFINISHED_TAG in versions(env)["1"], versions(env)   # marked
        (tmp_path / "round-2").touch()
        registered = result(2, log, child)["registered"]
    finally:
        (tmp_path / "stopped").touch()
        (tmp_path / "round-2").touch()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=120)
        if child.poll() is None:
            child.kill()
    assert registered["version"] == "1" and registered["created"], registered   # the same version, finished
    tags = versions(env)
    assert list(tags) == ["1"] and UNFINISHED_TAG not in tags["1"] and tags["1"]["artifact_sha256"] == sha, tags
    with mlflow_http(env) as mlflow:
        champion = mlflow.get("/registered-models/alias", params={"name": NAME, "alias": "champion"}).json()
    assert champion["model_version"]["version"] == "1", champion
