"""Every environment variable torchship reads or sets, named once with its default; every other module imports
its name from here. Plain constants and small functions (core: imports nothing of torchship). The copies that
cannot import Python (the Makefile's `export` line, prefect.yaml's job env) are checked against these by
tests/unit/test_env.py."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path

# Nothing phones home from a run, a test or a service (STACK.md: each library's switch, verified with a socket spy).
TELEMETRY_OFF = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
}
# Inductor's parallel compile workers fight inference (and each other) for 2 cores.
COMPILE_THREADS = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
# MLflow's client retries a request the tracking server refuses, drops or answers with 429/5xx (a server restarting,
# for an upgrade say) with urllib3's backoff: the 2nd try at once, then FACTOR * 2^(n-1) s before try n+1, plus up to
# JITTER s each. MLflow's defaults (7 retries, factor 2) wait up to about 4 min, the first retries already 4 and 8 s
# apart; factor 1 rides out a restart of a few seconds within a few seconds of the server's return, and reports a
# server that stays away after http_retry_window_s() (about 2 min). A request that is answered waits nothing more.
HTTP_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
MLFLOW_HTTP_RETRY = {HTTP_RETRIES_ENV: "7", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                     "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1.0"}
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"   # seconds between a flow run's heartbeat events
# What a deployed flow run needs beyond the worker's own environment: prefect.yaml's job env is exactly this.
JOB_ENV = {
    **TELEMETRY_OFF,
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",   # a bar per tiny download is noise in the run summary
    **COMPILE_THREADS,
    **MLFLOW_HTTP_RETRY,
    # Heartbeats let the server mark a run Crashed when its machine dies (tasks/workspace/crash_watch.py keeps the
    # value).
    # Every command sends them, not only deployed runs: `torchship run` against a server that has the watch would
    # otherwise beat at Prefect's default, slower than the watch's silence, and be marked Crashed while it works.
    HEARTBEAT_ENV: "30",
}
# Every CLI command besides (a deployment keeps Prefect's log level: its logs are what the UI shows).
QUIET = {
    **JOB_ENV,
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
    # Prefect waits 20 s for its ephemeral API: a first start migrates the database, which on a busy 2-core box
    # took longer and failed the whole run ("Timed out while attempting to connect to ephemeral Prefect API").
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}   # a child's log lines reach its log file as they are printed

# Concurrency leases on disk, not in the memory of whichever process ran the ephemeral API
# (tasks/workspace/lock.py), nor only in a server's memory: a restart would lose them while their slots stay taken,
# for good (the registry lock).
FILE_LEASES = "prefect.server.concurrency.lease_storage.filesystem"
LEASE_STORAGE_ENV = "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"
# How often a Prefect server gives back the slots of expired leases (Prefect's default: 15 s; the stack's: 5 s).
REPOSSESSOR_LOOP_ENV = "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS"
PREFECT_API_URL = "PREFECT_API_URL"   # a Prefect server to deploy to and send events to (unset: embedded)
PREFECT_UI_URL = "PREFECT_UI_URL"     # where that server's UI is, when not the API URL less its /api
MLFLOW_STORE_ENV = "MLFLOW_BACKEND_STORE_URI"   # `mlflow server --backend-store-uri`, off the command line

TOKEN_ENV = "TORCHSHIP_ADMIN_TOKEN"           # the service's admin endpoints need it; the canary sends it
WEBHOOK_URL_ENV = "TORCHSHIP_WEBHOOK_URL"     # where notifications go (a secret: never in params.yaml); unset: none
PARAMS_ENV, DEFAULT_PARAMS = "TORCHSHIP_PARAMS", "params.yaml"   # the params file `python -m serving` reads
SERVE_SETTINGS_ENV = "TORCHSHIP_SERVE_SETTINGS"   # serve.workers > 1: the settings each worker builds its app from
PARENT_RUN_ENV = "TORCHSHIP_PARENT_RUN_ID"    # a stage's MLflow run nests under the pipeline's
# A folder: the stage records its MLflow run there and `torchship run` logs it (tasks/core/tracking.py), so that a
# stage process never loads MLflow (about 2 CPU-s a stage). Unset: the stage logs itself.
STAGE_LOG_ENV = "TORCHSHIP_STAGE_LOG"
WORKSPACE_LEASE_ENV = "TORCHSHIP_WORKSPACE_LEASE"   # set for the workspace lock's holder and all it starts
# The team topology (a DVC remote off this disk): the train and compress stages mirror their checkpoints to it
# (tasks/training/mirror.py); `dvc repro` sets it for them, never for a rebuild.
CHECKPOINT_MIRROR_ENV = "TORCHSHIP_CHECKPOINT_MIRROR"
STAGE_RAN_ENV = "TORCHSHIP_STAGE_RAN"          # a file the stage touches when it runs (not restored by DVC)
STAGE_STARTED_ENV = "TORCHSHIP_STAGE_STARTED"  # when a training job's launcher started (its workers' timeline origin)
# torch's own switch, set for the training workers when train.compile is false so that nothing in them compiles (torch
# code that calls torch.compile itself runs eagerly): on a GPU, with compile false, epoch 1 took 45 s against 0.9 s
# for each later one while the log showed inductor compiling.
COMPILE_DISABLE_ENV = "TORCH_COMPILE_DISABLE"
FAULT_ENV = "TORCHSHIP_FAULT"                 # kind:rank:step, a real fault injected for the reliability tests
LOCAL_RANK_ENV = "LOCAL_RANK"                 # set by torchrun: this process is a training worker
OMP_THREADS_ENV = "OMP_NUM_THREADS"           # set per torchrun worker: the cores divided among them
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"   # set by torchrun: 0 on a worker's first attempt, then 1, 2...
# The interface gloo / nccl offer the other nodes (tasks/training/launch.py sets them to the one toward the rendezvous).
NODE_INTERFACE_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# torchrun shares its rendezvous store with the workers without a per-attempt prefix: after a restart a worker can
# read the previous attempt's addresses and fail to connect (pytorch/pytorch#135712, still so in torch 2.13).
UNSHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

# The team stack on loopback (tasks/ops/stack*.py): where its state lives, what its servers read, and what a client
# exports to reach them. Secrets travel only in these variables and in 0600 files, never on a command line.
STACK_DIR_ENV = "TORCHSHIP_STACK_DIR"           # the stack's state folder (default: the project's .stack/)
PG_PASSWORD_ENV = "PGPASSWORD"                  # libpq (psycopg2) and asyncpg read it: no password inside a DB URI
MLFLOW_TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_USERNAME_ENV, MLFLOW_PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
MLFLOW_ADMIN_PASSWORD_ENV = "MLFLOW_AUTH_ADMIN_PASSWORD"   # the basic-auth app creates its admin with it
MLFLOW_AUTH_CONFIG_ENV = "MLFLOW_AUTH_CONFIG_PATH"
MLFLOW_FLASK_KEY_ENV = "MLFLOW_FLASK_SERVER_SECRET_KEY"
MLFLOW_S3_ENDPOINT_ENV = "MLFLOW_S3_ENDPOINT_URL"
MLFLOW_JOBS_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
PREFECT_AUTH_ENV = "PREFECT_API_AUTH_STRING"    # a client's user:password for a server with auth on
PREFECT_SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
PREFECT_DB_URL_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
PREFECT_HOME_ENV = "PREFECT_HOME"
AWS_KEY_ID_ENV, AWS_SECRET_ENV = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
AWS_ENDPOINT_ENV, AWS_REGION_ENV = "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"
# With moto's credential checks on, the presigned links MLflow hands out for multipart transfers fail or hang for
# minutes (STACK.md): every client of the stack's MLflow server streams through the server instead.
MLFLOW_PROXIED_TRANSFERS = {"MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD": "false",
                            "MLFLOW_ENABLE_PROXY_MULTIPART_UPLOAD": "false"}

# Not an environment variable but the same kind of name, shared by the router (serving/front.py) and the canary's
# replay client: a request's sticky-split key (a user or session id).
KEY_HEADER = "x-torchship-key"


def http_retry_window_s(retry: dict[str, str] = MLFLOW_HTTP_RETRY) -> float:
    """The longest MLflow's client waits, all retries of one request together, before it reports the tracking server
    unreachable (connection refusals fail at once, so this is the bound on a server that is down; each try of a
    server that hangs may take MLFLOW_HTTP_REQUEST_TIMEOUT more)."""
    retries, factor = int(retry[HTTP_RETRIES_ENV]), float(retry["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"])
    jitter = float(retry["MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"])
    # urllib3's Retry.get_backoff_time: nothing before the 2nd try, each later wait capped at 120 s (its backoff_max)
    return sum(min(factor * 2 ** (n - 1) + jitter, 120.0) for n in range(2, retries + 1))


def set_defaults(values: dict[str, str], environ: MutableMapping[str, str] | None = None) -> None:
    """Set each variable that is not set already (a user's own setting wins); `environ`: os.environ as it is now."""
    target = os.environ if environ is None else environ
    for key, value in values.items():
        target.setdefault(key, value)


@contextlib.contextmanager
def kept(name: str) -> Iterator[None]:
    """The variable `name` as it was on entry (set to its value, or unset) again on exit, whatever the block did."""
    saved = os.environ.get(name)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def prefect_state(folder: Path) -> dict[str, str]:
    """Prefect's home, database and results inside `folder` (the project's .prefect/, not ~/.prefect)."""
    return {
        "PREFECT_HOME": str(folder),
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{folder / 'db' / 'prefect.db'}",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(folder / "storage"),
        # A result Prefect persists (a failed run's exception, a cached task's value) is JSON, never a pickle that
        # would run code when read back (tests/reliability/test_security.py).
        "PREFECT_RESULTS_DEFAULT_SERIALIZER": "json",
        LEASE_STORAGE_ENV: FILE_LEASES,
    }
