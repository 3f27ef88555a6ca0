"""How the team stack's servers start and are made ready: moto's S3 server with credential checks on, `mlflow
server` with basic auth and artifacts proxied to the bucket, `prefect server` with its auth string, process workers
on the pool `torchship deploy` uses; and what they share with PostgreSQL (flows/cli/stack/postgres.py): the address,
the database role, a clean environment. Passwords reach the servers by environment variables only (PGPASSWORD for
both database clients), so no URI, no config file and no command line holds one."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from flows.cli.stack.state import SWEEP_DB_SECRET, StackPaths
from tasks.core.env import (
    AWS_ENDPOINT_ENV,
    AWS_KEY_ID_ENV,
    AWS_REGION_ENV,
    AWS_SECRET_ENV,
    FILE_LEASES,
    JOB_ENV,
    LEASE_STORAGE_ENV,
    MLFLOW_ADMIN_PASSWORD_ENV,
    MLFLOW_AUTH_CONFIG_ENV,
    MLFLOW_FLASK_KEY_ENV,
    MLFLOW_JOBS_ENV,
    MLFLOW_PASSWORD_ENV,
    MLFLOW_PROXIED_TRANSFERS,
    MLFLOW_S3_ENDPOINT_ENV,
    MLFLOW_STORE_ENV,
    MLFLOW_TRACKING_URI_ENV,
    MLFLOW_USERNAME_ENV,
    PG_PASSWORD_ENV,
    PREFECT_API_URL,
    PREFECT_AUTH_ENV,
    PREFECT_DB_URL_ENV,
    PREFECT_HOME_ENV,
    PREFECT_SERVER_AUTH_ENV,
    REPOSSESSOR_LOOP_ENV,
    TELEMETRY_OFF,
    UNBUFFERED,
)
from tasks.core.errors import TorchshipError
from tasks.sweep.study import STORAGE_ENV as SWEEP_STORAGE_ENV

HOST = "127.0.0.1"
DB_ROLE, DATABASES = "torchship", ("mlflow", "mlflow_auth", "prefect")
# `torchship sweep`'s studies: a role of their own, so a worker that reaches them reaches no other database
SWEEP_ROLE, SWEEP_DATABASE = "torchship_sweep", "optuna"
BUCKET, REGION = "torchship", "us-east-1"
MLFLOW_USER, MLFLOW_ADMIN = "torchship", "admin"
POOL = "torchship-process"   # the process pool of prefect.yaml, which `torchship deploy` creates
BIN = Path(sys.executable).parent


def client_env(ports: Mapping[str, int], secrets: Mapping[str, str]) -> dict[str, str]:
    """What a client of the stack (a worker, a flow run, a user's shell) sets: every server's address and its
    credentials. tracking.uri in params.yaml is what torchship itself reads; MLflow's own tools read the variable.
    `torchship sweep`'s study database: its URL (no password) and its role's password as libpq's PGPASSWORD."""
    return {
        MLFLOW_TRACKING_URI_ENV: f"http://{HOST}:{ports['mlflow']}", MLFLOW_USERNAME_ENV: MLFLOW_USER,
        MLFLOW_PASSWORD_ENV: secrets[MLFLOW_PASSWORD_ENV], **MLFLOW_PROXIED_TRANSFERS,
        PREFECT_API_URL: f"http://{HOST}:{ports['prefect']}/api", PREFECT_AUTH_ENV: secrets[PREFECT_AUTH_ENV],
        AWS_ENDPOINT_ENV: f"http://{HOST}:{ports['moto']}", AWS_REGION_ENV: REGION,
        AWS_KEY_ID_ENV: secrets[AWS_KEY_ID_ENV], AWS_SECRET_ENV: secrets[AWS_SECRET_ENV],
        SWEEP_STORAGE_ENV: database_uri("psycopg2", ports["postgres"], SWEEP_DATABASE, SWEEP_ROLE),
        PG_PASSWORD_ENV: secrets[SWEEP_DB_SECRET],
    }


def base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without any Prefect, MLflow, AWS or libpq setting (a shell pointed at another
    server must not leak into this stack's), telemetry off, output unbuffered into the logs."""
    kept = {k: v for k, v in environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "AWS_", "PG"))}
    return {**kept, **TELEMETRY_OFF, **UNBUFFERED}


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float, log: Path | None = None) -> None:
    """Poll `ready()` (errors count as not yet) until true; a bounded wait that names the log on failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            where = f"; its log: {log}" if log else ""
            raise TorchshipError(f"{what} was not ready within {timeout_s:g} s{where}. "
                                 f"See `torchship stack status`, then `torchship stack down` and up again.")
        time.sleep(0.2)


def http_answers(url: str, ok: Callable[[object], bool] = lambda response: response.status_code == 200,
                 headers: Mapping[str, str] | None = None) -> Callable[[], bool]:
    import httpx

    return lambda: ok(httpx.get(url, timeout=2.0, headers=dict(headers or {})))


def run_checked(what: str, command: list[str], env: Mapping[str, str], stdin: str | None = None) -> None:
    done = subprocess.run(command, env=dict(env), input=stdin, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise TorchshipError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout)[-1500:]}")


def database_uri(driver: str, port: int, database: str, role: str = DB_ROLE) -> str:
    """No password inside: the client reads PGPASSWORD."""
    return f"postgresql+{driver}://{role}@{HOST}:{port}/{database}"


def moto_command(port: int) -> list[str]:
    # The module, not the `moto_server` script: a script's shebang names the interpreter of the venv it was installed
    # from, and breaks when that venv moves (seen here: scripts pointing into a removed worktree's venv).
    return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]


def bootstrap_moto(port: int, seed: str) -> dict[str, str]:
    """With any key (moto checks nothing yet): an IAM user allowed s3:*, its access key and the bucket; then
    credential checks on. Seeding moto's generator first makes the key the same on every up. Returns the key."""
    import boto3
    import httpx

    url = f"http://{HOST}:{port}"
    # In the body: a query string would be written to moto's access log.
    httpx.post(f"{url}/moto-api/seed", data={"a": seed}, timeout=10).raise_for_status()
    anyone = {"endpoint_url": url, "region_name": REGION, "aws_access_key_id": "bootstrap",
              "aws_secret_access_key": "bootstrap"}
    iam = boto3.client("iam", **anyone)
    iam.create_user(UserName=DB_ROLE)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName=DB_ROLE, PolicyName="s3-all", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=DB_ROLE)["AccessKey"]
    boto3.client("s3", **anyone).create_bucket(Bucket=BUCKET)
    # From now on an unknown key, a wrong secret or a key without a policy is refused.
    httpx.post(f"{url}/moto-api/reset-auth", content=b"0", timeout=10).raise_for_status()
    return {AWS_KEY_ID_ENV: key["AccessKeyId"], AWS_SECRET_ENV: key["SecretAccessKey"]}


def mlflow_command(port: int) -> list[str]:
    # One uvicorn worker and no job runner: ~540 MiB instead of ~3.3 GiB (STACK.md).
    return [str(BIN / "mlflow"), "server", "--host", HOST, "--port", str(port), "--workers", "1",
            "--app-name", "basic-auth", "--artifacts-destination", f"s3://{BUCKET}/mlflow"]


def mlflow_env(paths: StackPaths, ports: Mapping[str, int], secrets: Mapping[str, str],
               environ: Mapping[str, str]) -> dict[str, str]:
    """The server's store, its auth app (config file without secrets) and its S3 keys, all by environment."""
    auth_ini = paths.home("mlflow") / "basic_auth.ini"
    auth_ini.parent.mkdir(parents=True, exist_ok=True)
    auth_ini.write_text("[mlflow]\ndefault_permission = READ\n"
                        f"database_uri = {database_uri('psycopg2', ports['postgres'], 'mlflow_auth')}\n"
                        f"admin_username = {MLFLOW_ADMIN}\n"
                        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                        # a password check is a deliberately slow hash (~0.5 s a request on a busy 2-core box: a
                        # pipeline run makes hundreds); a good one is remembered for a minute (one server process,
                        # so a password change holds at once there; a wrong password is never remembered)
                        "auth_cache_ttl_seconds = 60\n")
    return {**base_env(environ), MLFLOW_STORE_ENV: database_uri("psycopg2", ports["postgres"], "mlflow"),
            PG_PASSWORD_ENV: secrets[PG_PASSWORD_ENV], MLFLOW_AUTH_CONFIG_ENV: str(auth_ini),
            MLFLOW_ADMIN_PASSWORD_ENV: secrets[MLFLOW_ADMIN_PASSWORD_ENV],
            MLFLOW_FLASK_KEY_ENV: secrets[MLFLOW_FLASK_KEY_ENV], MLFLOW_JOBS_ENV: "false",
            MLFLOW_S3_ENDPOINT_ENV: f"http://{HOST}:{ports['moto']}", AWS_REGION_ENV: REGION,
            AWS_KEY_ID_ENV: secrets[AWS_KEY_ID_ENV], AWS_SECRET_ENV: secrets[AWS_SECRET_ENV]}


def ensure_mlflow_user(port: int, secrets: Mapping[str, str]) -> None:
    """The non-admin user clients log in as (created by the admin, its password kept in step with the file)."""
    import httpx

    url, admin = f"http://{HOST}:{port}/api/2.0/mlflow/users", (MLFLOW_ADMIN, secrets[MLFLOW_ADMIN_PASSWORD_ENV])
    body = {"username": MLFLOW_USER, "password": secrets[MLFLOW_PASSWORD_ENV]}
    created = httpx.post(f"{url}/create", json=body, auth=admin, timeout=30)
    if created.status_code != 200 and "RESOURCE_ALREADY_EXISTS" in created.text:
        created = httpx.patch(f"{url}/update-password", json=body, auth=admin, timeout=30)
    if created.status_code != 200:
        raise TorchshipError(f"MLflow refused to set up user {MLFLOW_USER} (HTTP {created.status_code}): "
                             f"{created.text[:300]}")


def prefect_server_command(port: int) -> list[str]:
    return [str(BIN / "prefect"), "server", "start", "--host", HOST, "--port", str(port)]


REPOSSESSOR_LOOP_S = 5   # a dead holder's registry lock is free within 60 s + this (tasks/core/prefect_limits.py)


def prefect_server_env(paths: StackPaths, ports: Mapping[str, int], secrets: Mapping[str, str],
                       environ: Mapping[str, str]) -> dict[str, str]:
    """Leases on disk in the server's home (kept across `stack down`/`up`: a restart must not strand a taken slot),
    expired ones given back every REPOSSESSOR_LOOP_S."""
    return {**base_env(environ), PREFECT_HOME_ENV: str(paths.home("prefect")),
            LEASE_STORAGE_ENV: FILE_LEASES, REPOSSESSOR_LOOP_ENV: str(REPOSSESSOR_LOOP_S),
            PREFECT_DB_URL_ENV: database_uri("asyncpg", ports["postgres"], "prefect"),
            PG_PASSWORD_ENV: secrets[PG_PASSWORD_ENV], PREFECT_SERVER_AUTH_ENV: secrets[PREFECT_AUTH_ENV]}


def prefect_headers(secrets: Mapping[str, str]) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(secrets[PREFECT_AUTH_ENV].encode()).decode()}


def ensure_pool(port: int, secrets: Mapping[str, str]) -> None:
    """The process work pool, created through the API when missing (before the workers, which would race)."""
    import httpx

    api = f"http://{HOST}:{port}/api"
    created = httpx.post(f"{api}/work_pools/", json={"name": POOL, "type": "process"},
                         headers=prefect_headers(secrets), timeout=30)
    if created.status_code not in (201, 409):   # 409: it exists already
        raise TorchshipError(f"Prefect refused to create work pool {POOL} (HTTP {created.status_code}): "
                             f"{created.text[:300]}")


def worker_command(name: str) -> list[str]:
    return [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--name", name]


def worker_env(paths: StackPaths, name: str, ports: Mapping[str, int], secrets: Mapping[str, str],
               environ: Mapping[str, str]) -> dict[str, str]:
    """A worker's flow runs inherit this: every server's address and credentials, and the job env."""
    return {**base_env(environ), **JOB_ENV, **client_env(ports, secrets), PREFECT_HOME_ENV: str(paths.home(name))}


def workers_online(port: int, secrets: Mapping[str, str], names: list[str], since: float) -> Callable[[], bool]:
    """True once every named worker has sent a heartbeat after `since` (a record from a previous up is older)."""
    from datetime import datetime

    import httpx

    def probe() -> bool:
        found = httpx.post(f"http://{HOST}:{port}/api/work_pools/{POOL}/workers/filter", json={},
                           headers=prefect_headers(secrets), timeout=5).json()
        beats = {w["name"]: datetime.fromisoformat(w["last_heartbeat_time"]).timestamp()
                 for w in found if w.get("last_heartbeat_time")}
        return all(beats.get(name, 0) > since for name in names)

    return probe
