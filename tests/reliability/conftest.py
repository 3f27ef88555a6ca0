"""One project for the secrets and closing-line tests: fake secrets planted where real ones live, then one
`torchship run` that runs every stage, bless and register, and fails during the canary (its service gets no
time to start): the failure point whose closing line used to say nothing was registered."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest

from tests.conftest import BIN, PrefectServer, Project, make_project

SECRETS = {  # where each lives -> a value no real code would write by chance
    "TORCHSHIP_ADMIN_TOKEN": "fake-admin-token-5ee1c3a7",
    "MLFLOW_TRACKING_PASSWORD": "fake-mlflow-password-9b2d",
    "MLFLOW_TRACKING_TOKEN": "fake-mlflow-token-41f8e0",
    "AWS_SECRET_ACCESS_KEY": "fake-aws-secret-c0ffee77",
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEY7731",
}
DVC_REMOTE_PASSWORD = "fake-dvc-remote-password-77aa"
PLANTED_IN = ".dvc/config.local"      # the one file a secret is meant to be in


@dataclass
class SecretRun:
    project: Project
    canary_failed: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def secret_run(tmp_path_factory, prefect_server: PrefectServer) -> SecretRun:
    project = make_project(tmp_path_factory.mktemp("secrets"), prefect=prefect_server)  # no API to start per run
    (project.root / PLANTED_IN).write_text(   # two remotes (not the default one): cloud keys, an HTTP password
        "['remote \"vault\"']\n    url = s3://torchship-fake-bucket/store\n"
        f"    access_key_id = {SECRETS['AWS_ACCESS_KEY_ID']}\n    secret_access_key = {SECRETS['AWS_SECRET_ACCESS_KEY']}\n"
        "['remote \"web\"']\n    url = https://dvc.invalid/store\n    auth = basic\n    user = torchship\n"
        f"    password = {DVC_REMOTE_PASSWORD}\n")
    env = {**project.env(), **SECRETS, "MLFLOW_TRACKING_USERNAME": "torchship"}

    failed = subprocess.run([str(BIN / "torchship"), "run", "--set", "canary.startup_timeout_s=0.01"],
                            cwd=project.root, capture_output=True, text=True, timeout=900, env=env)
    return SecretRun(project, failed)
