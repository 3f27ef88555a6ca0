"""`torchship stack up|status|env|down` through the real CLI: PostgreSQL (Debian's), moto's S3 with credential checks,
`mlflow server` with basic auth, `prefect server` with its auth string, and a process worker, all on 127.0.0.1. The
stack is the journey's (tests/conftest.py team_stack: one start-up for both, these checks after the journey).

torchship's own tracking set-up, given only what `torchship stack env` prints (the variables, and the tracking
params for `--set`), logs a run whose artifact lands in the bucket (read back with boto3) (a whole pipeline on the
stack, and the planted-secrets search over it, are the journey test's: tests/integration/test_journey.py); wrong S3
keys and a wrong MLflow or Prefect password are refused; no secret is on any process's command line or in the logs;
the secrets file is 0600 and the same after down/up, and the run is still there (PostgreSQL kept it), and `up
--workers 1` adds a worker; down leaves nothing running. And register, with the tracking server stopped mid-way for
longer than the client retries, fails clearly and the next attempt finishes the same version. Run it alone with
`pytest -m stack`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli.stack.servers import BUCKET, HOST
from flows.cli.stack.state import StackPaths, StackState, read_env_file, stop_group
from tasks.core.env import HTTP_RETRIES_ENV
from tasks.registry.read import UNFINISHED_TAG
from tasks.stages.overrides import parse_assignment
from tests.conftest import REPO, TEAM_STACK_GROUP
from tests.helpers.register_child import result, start_register_child
from tests.helpers.stack import evaluated, mlflow_http, prefect_http, read, running, s3_client
from tests.helpers.stack import stack_cli as torchship

pytestmark = [pytest.mark.integration, pytest.mark.stack, pytest.mark.xdist_group(TEAM_STACK_GROUP)]
SERVER_DOWN = "server-down"   # the model the server-down test registers

def versions(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """The model's versions on the server, with their tags."""
    with mlflow_http(env) as mlflow:
        found = mlflow.get("/model-versions/search", params={"filter": f"name='{SERVER_DOWN}'"}).json()
    return {v["version"]: {t["key"]: t["value"] for t in v.get("tags", [])} for v in found.get("model_versions", [])}


def statuses(paths: StackPaths) -> dict[str, str]:
    """part -> up | down, from `torchship stack status`."""
    rows = [line.split() for line in torchship(paths, "status", timeout=60).splitlines()[1:]]
    return {row[0]: row[1] for row in rows if len(row) > 1}


def stack_pids(paths: StackPaths) -> list[int]:
    state = StackState.load(paths)
    pids = [int(record["pid"]) for record in state.processes.values()]
    pid_file = paths.postgres / "data" / "postmaster.pid"
    return pids + ([int(pid_file.read_text().split()[0])] if pid_file.exists() else [])


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) == 0


@pytest.fixture(scope="module")
def stack(team_stack):
    """The shared stack (tests/conftest.py team_stack, after the journey where both run), up without workers: this
    module's last tests take it down, bring it up with a worker, and take it down again."""
    began = time.monotonic()
    torchship(team_stack, "up", "--workers", "0")
    print(f"\nstack up: {time.monotonic() - began:.1f} s")
    return team_stack


@pytest.fixture(scope="module")
def env_lines(stack) -> str:
    """What `torchship stack env` prints (the same after down/up: the ports are kept)."""
    return torchship(stack, "env")


@pytest.fixture(scope="module")
def env(env_lines) -> dict[str, str]:
    return evaluated(env_lines)


def test_up_starts_every_part_and_a_second_up_changes_nothing(stack):
    assert statuses(stack) == {"postgres": "up", "moto": "up", "mlflow": "up", "prefect": "up"}
    before = stack_pids(stack)
    began = time.monotonic()
    torchship(stack, "up", "--workers", "0")
    print(f"second up (all running): {time.monotonic() - began:.1f} s")
    assert stack_pids(stack) == before


# A stage's own MLflow set-up (tasks/core/tracking.py), as a pipeline run on the stack does it, in a process of its
# own with the shell's environment after eval: MLflow's tracking URI and active experiment are process-wide.
LOG_A_RUN = """
import json, sys, mlflow
from tasks.core.params_spec import TrackingParams
from tasks.core.tracking import stage_run
with stage_run(TrackingParams(**json.loads(sys.argv[1]), experiment="stack-test"), "stack-test") as run:
    mlflow.log_param("rows", 3)
    mlflow.log_text("hello from the stack", "notes/hello.txt")
print(run.info.run_id)
"""


def test_torchship_set_up_by_what_stack_env_prints_logs_a_run_whose_artifact_lands_in_the_bucket(stack, env_lines,
                                                                                                   env):
    # the params line it prints, read as `torchship run --set` reads it
    settings = {keys[-1]: value for keys, value in map(parse_assignment, re.findall(r"--set (\S+)", env_lines))}
    assert set(settings) == {"uri", "artifacts"}
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("MLFLOW_", "AWS_", "PREFECT_"))}
    logged = subprocess.run([sys.executable, "-c", LOG_A_RUN, json.dumps(settings)], cwd=REPO,
                            env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert logged.returncode == 0, logged.stderr[-3000:]
    run_id = logged.stdout.split()[-1]
    keys = [item["Key"] for item in s3_client(env).list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(key.endswith(f"{run_id}/artifacts/notes/hello.txt") for key in keys), keys
    (stack.root / "test-run-id").write_text(run_id)


def test_wrong_s3_keys_are_refused(env):
    from botocore.exceptions import ClientError

    for override, code in (({"aws_secret_access_key": "wrong" * 8}, "SignatureDoesNotMatch"),
                           ({"aws_access_key_id": "AKIAWRONGWRONGWRONG1"}, "InvalidAccessKeyId")):
        with pytest.raises(ClientError) as refused:
            s3_client(env, **override).list_objects_v2(Bucket=BUCKET)
        assert refused.value.response["Error"]["Code"] == code


def test_a_wrong_mlflow_or_prefect_password_is_refused(env):
    user = env["MLFLOW_TRACKING_USERNAME"]   # {}: the stack's own credentials
    for auth, status in (({}, 200), ({"auth": (user, "wrong-password")}, 401), ({"auth": None}, 401)):
        with mlflow_http(env, **auth) as mlflow:
            assert mlflow.get("/experiments/search", params={"max_results": 1}).status_code == status
    user = env["PREFECT_API_AUTH_STRING"].split(":")[0]
    for auth, status in (({}, 200), ({"auth": (user, "wrong-password")}, 401)):
        with prefect_http(env, **auth) as prefect:
            assert prefect.post("/flows/filter", json={}).status_code == status


# An alias move's lock, as a worker on the stack takes it: the Prefect limit of the model, through the auth string.
HOLD_THE_REGISTRY_LOCK = """
import sys
from mlflow import MlflowClient
from tasks.registry.lock import alias_lock, limit_name
with alias_lock(MlflowClient(sys.argv[1], sys.argv[1]), "stack-model", timeout=30):
    print("held", limit_name("stack-model"))
"""


def test_the_registry_lock_is_taken_on_the_stack_prefect_server_whose_leases_are_on_disk(stack, env):
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("MLFLOW_", "AWS_", "PREFECT_"))}
    held = subprocess.run([sys.executable, "-c", HOLD_THE_REGISTRY_LOCK, env["MLFLOW_TRACKING_URI"]], cwd=REPO,
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert held.returncode == 0, held.stderr[-3000:]
    assert held.stdout.split() == ["held", "torchship-registry-stack-model"]
    assert (stack.home("prefect") / "concurrency_leases").is_dir()   # a restart keeps a held lease


def test_no_secret_is_on_any_command_line_or_in_the_logs(stack):
    secrets = [value for value in read_env_file(stack.secrets).values() if len(value) >= 8]
    assert len(secrets) >= 7
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        text = read(cmdline).replace(b"\0", b" ").decode(errors="replace")
        found += [f"{cmdline}: secret #{i}" for i, secret in enumerate(secrets) if secret in text]
    for log in [*stack.logs.glob("*.log"), *(stack.postgres / "log").glob("*.log")]:
        text = log.read_text(errors="replace")
        found += [f"{log}: secret #{i}" for i, secret in enumerate(secrets) if secret in text]
    assert not found


@pytest.mark.timeout(900)
def test_register_fails_clearly_while_the_server_is_away_then_finishes_the_same_version(tiny_pipeline, stack, env,
                                                                                         tmp_path):
    """The tracking server gone during register for longer than MLflow's client retries a request: the real register
    step in its own process, on the session's pipeline outputs. The server is stopped once the version exists and
    before its tags are written: the step fails with TrackingServerDown, naming the server, the bound and the way
    back, and the version it created is marked `register_unfinished` (no alias). The server started again
    (`torchship stack up`), the step run again in the same process finishes that same version. The child shortens
    the client's retries (3 instead of 7: a window of 8 s instead of 132 s); the code paths are a longer outage's.
    A restart inside the window is the journey's step 4 (tests/integration/test_journey.py)."""
    project, _ = tiny_pipeline
    paths = stack
    sha = hashlib.sha256((project.root / "data/profile/model.onnx").read_bytes()).hexdigest()
    log = tmp_path / "register.log"
    child = start_register_child(project, tmp_path, sha, SERVER_DOWN,
                                 {"uri": env["MLFLOW_TRACKING_URI"], "artifacts": None, "experiment": SERVER_DOWN},
                                 "stopped", log, {**project.env(), **env, HTTP_RETRIES_ENV: "3"})
    try:
        state = StackState.load(paths)
        stop_group(state.processes.pop("mlflow"), 20)   # the server goes, for longer than the client retries
        state.save(paths)
        (tmp_path / "stopped").touch()
        outcome = result(1, log, child)
        assert "TrackingServerDown" in outcome, outcome
        said = outcome["TrackingServerDown"]
        assert f"{env['MLFLOW_TRACKING_URI']} did not answer for 8 s" in said and UNFINISHED_TAG in said, said
        began = time.monotonic()
        torchship(paths, "up", "--workers", "0")   # starts what is not running: the MLflow server
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
        champion = mlflow.get("/registered-models/alias", params={"name": SERVER_DOWN, "alias": "champion"}).json()
    assert champion["model_version"]["version"] == "1", champion


def test_the_secrets_file_is_private_and_survives_down_and_up(stack, env):
    assert stat.S_IMODE(stack.secrets.stat().st_mode) == 0o600
    before = stack.secrets.read_text()
    pids, ports = stack_pids(stack), StackState.load(stack).ports
    assert len(pids) == 4
    assert "stopped: prefect, mlflow, moto, postgres" in torchship(stack, "down", timeout=120)
    assert_nothing_runs(stack, pids, ports)
    began = time.monotonic()
    torchship(stack, "up", "--workers", "1")   # now with a process worker on the stack's pool
    print(f"up again: {time.monotonic() - began:.1f} s")
    assert statuses(stack) == {"postgres": "up", "moto": "up", "mlflow": "up", "prefect": "up", "worker-1": "up"}
    assert stack.secrets.read_text() == before and stat.S_IMODE(stack.secrets.stat().st_mode) == 0o600
    assert evaluated(torchship(stack, "env")) == env
    run_id = (stack.root / "test-run-id").read_text()
    with mlflow_http(env) as mlflow:
        kept = mlflow.get("/runs/get", params={"run_id": run_id})
    assert kept.status_code == 200, kept.text   # PostgreSQL kept the run (moto's objects are in memory only)
    s3_client(env).head_bucket(Bucket=BUCKET)    # the same keys work on the new moto: issued from the same seed


def test_down_leaves_nothing_running_and_a_second_down_is_a_no_op(stack):
    pids, ports = stack_pids(stack), StackState.load(stack).ports
    assert len(pids) == 5
    assert "stopped: worker-1, prefect, mlflow, moto, postgres" in torchship(stack, "down", timeout=120)
    assert_nothing_runs(stack, pids, ports)
    assert "nothing was running" in torchship(stack, "down", timeout=60)


def assert_nothing_runs(stack: StackPaths, pids: list[int], ports: dict[str, int]) -> None:
    """None of the stack's processes runs, none of its ports listens, and no process works in its folder or names
    it (each part starts in its own folder there and its children inherit that; PostgreSQL's name its data)."""
    assert not [pid for pid in pids if running(pid)]
    assert not [name for name, port in ports.items() if listening(port)]
    assert not [proc.name for proc in Path("/proc").glob("[0-9]*")
                if running(int(proc.name)) and in_folder(proc, stack)]


def in_folder(proc: Path, stack: StackPaths) -> bool:
    try:
        cwd = os.readlink(proc / "cwd")
    except OSError:
        cwd = ""
    return cwd.startswith(str(stack.root)) or str(stack.root).encode() in read(proc / "cmdline")
