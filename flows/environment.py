"""Process environment for every entry point: project-local state, no telemetry. Set before Prefect is imported."""
from __future__ import annotations

import os
from pathlib import Path

QUIET = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",   # a bar per tiny download is noise in the run summary
    "DO_NOT_TRACK": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",   # inductor's compile workers fight inference for 2 cores
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
    # Prefect waits 20 s for its ephemeral API: a first start migrates the database, which on a busy 2-core box
    # took longer and failed the whole run ("Timed out while attempting to connect to ephemeral Prefect API").
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


def find_project_root(start: Path | None = None) -> Path:
    """The folder holding params.yaml and dvc.yaml, from here upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "params.yaml").exists() and (folder / "dvc.yaml").exists():
            return folder
    return here


def configure_environment(root: Path) -> None:
    """Keep Prefect's database and results inside the project (not ~/.prefect); switch telemetry off."""
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    state = root / ".prefect"
    (state / "db").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(state))
    os.environ.setdefault("PREFECT_API_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{state / 'db' / 'prefect.db'}")
    os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str(state / "storage"))
    # A result Prefect persists (a failed run's exception, a cached task's value) is JSON, never a pickle that
    # would run code when read back (tests/reliability/test_security.py).
    os.environ.setdefault("PREFECT_RESULTS_DEFAULT_SERIALIZER", "json")
    # The embedded API gets 20 s to start by default; on a busy 2-core box it took longer and the run failed
    # with "Timed out while attempting to connect to ephemeral Prefect API server".
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # Concurrency leases on disk, not in the memory of whichever process ran the ephemeral API: flows/slot.py
    os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE", "prefect.server.concurrency.lease_storage.filesystem")
    # The ephemeral API gets 20 s to start by default: on a busy 2-core box that is not always enough.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def enter_project(start: Path | None = None) -> Path:
    """Every command runs in the project folder (paths in params.yaml and dvc.yaml are relative to it)."""
    root = find_project_root(start)
    os.chdir(root)
    configure_environment(root)
    return root


def server_configured() -> bool:
    """A Prefect server to send events to (else: the embedded default, where nothing would hear them)."""
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())
