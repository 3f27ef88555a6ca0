"""What the stack's tests share (tests/integration/test_stack.py, test_journey.py): the parts they need, the CLI,
what `torchship stack env` exports, clients with the stack's credentials, and the searches for its secrets."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from flows.cli.stack.state import StackPaths
from tasks.core.env import STACK_DIR_ENV
from tests.conftest import BIN, REPO

HTTP_TIMEOUT_S = 60   # httpx's default 5 s: a server's first answer after `up` took longer at load 10 on 2 cores
UP_TIMEOUT_S = 400   # a first up migrates two databases; on a busy 2-core box that took up to 80 s


def require_parts() -> None:
    """PostgreSQL and moto must be installed (`make stack-deps`); a skip says so, a failure under CI=true."""
    missing = [what for what, there in (("Debian's postgresql", any(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))),
                                        ("moto[server]", (BIN / "moto_server").exists())) if not there]
    if missing:
        message = f"{', '.join(missing)} not installed: run `make stack-deps`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def stack_cli(paths: StackPaths, *args: str, timeout: float = UP_TIMEOUT_S) -> str:
    """`torchship stack ARGS` on the stack in `paths`; its output, after asserting it succeeded."""
    done = subprocess.run([str(BIN / "torchship"), "stack", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, STACK_DIR_ENV: str(paths.root)})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def evaluated(lines: str) -> dict[str, str]:
    """The variables the lines of `torchship stack env` export, as a shell has them after eval."""
    dumped = subprocess.run(["bash", "-c", f'{lines}\nenv -0'], capture_output=True, text=True, check=True, timeout=30)
    exported = re.findall(r"^export (\w+)=", lines, flags=re.M)
    return {name: value for name, value in (item.split("=", 1) for item in dumped.stdout.split("\0") if "=" in item)
            if name in exported}


def s3_client(env: dict[str, str], **override):
    import boto3

    keys = {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            **override}
    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_DEFAULT_REGION"], **keys)


def mlflow_http(env: dict[str, str], **auth):
    """An HTTP client on MLflow's REST API with the stack's user (or `auth=`), and patient timeouts."""
    import httpx

    return httpx.Client(base_url=f"{env['MLFLOW_TRACKING_URI']}/api/2.0/mlflow", timeout=HTTP_TIMEOUT_S,
                        auth=auth.get("auth", (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])))


def prefect_http(env: dict[str, str], **auth):
    """An HTTP client on Prefect's API with the stack's auth string (or `auth=`)."""
    import httpx

    return httpx.Client(base_url=env["PREFECT_API_URL"], timeout=HTTP_TIMEOUT_S,
                        auth=auth.get("auth", tuple(env["PREFECT_API_AUTH_STRING"].split(":", 1))))


def read(path: Path) -> bytes:
    """A /proc file, or nothing when its process ended meanwhile."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def running(pid: int) -> bool:
    """Runs, and is not a zombie waiting for its parent."""
    fields = read(Path(f"/proc/{pid}/stat")).rsplit(b")", 1)[-1].split()
    return bool(fields) and fields[0] != b"Z"


def server_records(env: dict[str, str]) -> dict:
    """What the servers keep about the runs: MLflow's runs (params, tags) and model versions (tags), and
    Prefect's flow runs (parameters)."""
    with mlflow_http(env) as mlflow, prefect_http(env) as prefect:
        experiments = mlflow.post("/experiments/search", json={"max_results": 100}).json()
        ids = [e["experiment_id"] for e in experiments.get("experiments", [])]
        runs = mlflow.post("/runs/search", json={"experiment_ids": ids, "max_results": 1000})
        versions = mlflow.get("/model-versions/search", params={"max_results": 1000})
        flow_runs = prefect.post("/flow_runs/filter", json={})
    for answer in (runs, versions, flow_runs):
        assert answer.status_code == 200, answer.text[:500]
    return {"runs": runs.json().get("runs", []), "versions": versions.json().get("model_versions", []),
            "flow_runs": flow_runs.json()}


def bucket_texts(env: dict[str, str], bucket: str) -> dict[str, str]:
    """Every object of the bucket but DVC's (the data, hashed by content), as text, by its s3:// URL."""
    client = s3_client(env)
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {f"s3://{bucket}/{key}": client.get_object(Bucket=bucket, Key=key)["Body"].read().decode(errors="replace")
            for key in keys if not key.startswith("dvc/")}
