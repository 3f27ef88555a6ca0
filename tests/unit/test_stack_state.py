"""The team stack's state without servers: the secrets file (0600, generated once, kept), the shell lines of
`torchship stack env` (credentials read at eval time, never printed), and the clean environment the servers get."""
from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest

from flows.cli.stack.lifecycle import shell_env, stack_restart
from flows.cli.stack.servers import base_env
from flows.cli.stack.state import GENERATED, StackPaths, StackState, load_secrets, read_env_file
from tasks.core.env import AWS_KEY_ID_ENV, AWS_SECRET_ENV, MLFLOW_PASSWORD_ENV, PREFECT_AUTH_ENV
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import TrackingParams
from tasks.core.tracking import is_uri
from tasks.stages.overrides import parse_assignment

S3_KEYS = {AWS_KEY_ID_ENV: "AKIAEXAMPLEEXAMPLE12", AWS_SECRET_ENV: "abc+def/ghi"}


def test_secrets_are_generated_once_into_a_0600_file_and_kept(tmp_path):
    paths = StackPaths(tmp_path)
    first = load_secrets(paths)
    assert set(GENERATED) <= set(first) and stat.S_IMODE(paths.secrets.stat().st_mode) == 0o600
    paths.secrets.chmod(0o644)   # widened by a copy: the next load narrows it again
    assert load_secrets(paths) == first and stat.S_IMODE(paths.secrets.stat().st_mode) == 0o600
    assert load_secrets(paths, S3_KEYS) == {**first, **S3_KEYS} == read_env_file(paths.secrets)


def test_stack_env_prints_no_secret_and_its_eval_exports_them(tmp_path):
    paths = StackPaths(tmp_path)
    secrets = load_secrets(paths, S3_KEYS)
    StackState(ports={"postgres": 1, "moto": 2, "mlflow": 3, "prefect": 4}).save(paths)
    lines = shell_env(paths)
    assert not [name for name, value in secrets.items() if value in lines]
    shell = subprocess.run(["bash", "-c", f"{lines}\nenv -0"], capture_output=True, text=True, check=True,
                           env={"PATH": os.environ["PATH"]})
    exported = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
    for name in (MLFLOW_PASSWORD_ENV, PREFECT_AUTH_ENV, AWS_KEY_ID_ENV, AWS_SECRET_ENV):
        assert exported[name] == secrets[name]
    assert exported["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:3"


def test_servers_start_from_an_environment_without_another_servers_settings():
    env = base_env({"PATH": "/bin", "PREFECT_API_URL": "http://elsewhere", "MLFLOW_TRACKING_URI": "x",
                    "AWS_PROFILE": "prod", "PGHOST": "db"})
    assert "PATH" in env and not [name for name in env if name.startswith(("PREFECT_API", "MLFLOW_TRACKING",
                                                                           "AWS_", "PG"))]


def test_the_printed_params_leave_the_artifact_location_to_the_server(tmp_path):
    """A server with basic auth judges a proxied artifact by the experiment id that starts its path: only the
    server's default location, mlflow-artifacts:/<experiment id>, lets a user who is not admin write artifacts."""
    paths = StackPaths(tmp_path)
    load_secrets(paths, S3_KEYS)
    StackState(ports={"postgres": 1, "moto": 2, "mlflow": 3, "prefect": 4}).save(paths)
    printed = re.findall(r"--set (\S+)", shell_env(paths))
    assigned = {tuple(keys): value for keys, value in map(parse_assignment, printed)}
    assert assigned == {("tracking", "uri"): "http://127.0.0.1:3", ("tracking", "artifacts"): None}
    assert TrackingParams(uri="http://127.0.0.1:3", artifacts=None).artifacts is None
    assert is_uri("mlflow-artifacts:/1") and is_uri("s3://bucket/x")
    assert not is_uri("mlflow/artifacts") and not is_uri("C:/mlflow/artifacts")


def test_stack_restart_restarts_only_the_tracking_or_prefect_server(tmp_path):
    with pytest.raises(TorchshipError, match="restarts mlflow or prefect, not 'postgres'"):
        stack_restart(StackPaths(tmp_path), "postgres", {})
    with pytest.raises(TorchshipError, match="no stack in"):
        stack_restart(StackPaths(tmp_path), "mlflow", {})
