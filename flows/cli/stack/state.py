"""The team stack's state on disk: its folder, the one 0600 file of generated secrets (kept across down/up), the
ports and processes of each part (stack.json), and the process checks `status` and `down` rely on."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.core.env import (
    MLFLOW_ADMIN_PASSWORD_ENV,
    MLFLOW_FLASK_KEY_ENV,
    MLFLOW_PASSWORD_ENV,
    PG_PASSWORD_ENV,
    PREFECT_AUTH_ENV,
)
from tasks.core.errors import TorchshipError

MOTO_SEED = "MOTO_SEED"   # seeds moto's generator, so the S3 keys it issues are the same after every up
SWEEP_DB_SECRET = "TORCHSHIP_SWEEP_PGPASSWORD"   # the sweep's study database role; its clients read it as PGPASSWORD
# Each generated secret, by the variable its user reads. The S3 keys are moto's (issued at up, then stored here).
GENERATED = {
    PG_PASSWORD_ENV: lambda: secrets.token_urlsafe(24),
    MLFLOW_ADMIN_PASSWORD_ENV: lambda: secrets.token_urlsafe(24),   # the basic-auth app wants >= 12 characters
    MLFLOW_PASSWORD_ENV: lambda: secrets.token_urlsafe(24),
    MLFLOW_FLASK_KEY_ENV: lambda: secrets.token_hex(32),
    PREFECT_AUTH_ENV: lambda: f"torchship:{secrets.token_urlsafe(24)}",
    MOTO_SEED: lambda: str(secrets.randbits(62)),
    SWEEP_DB_SECRET: lambda: secrets.token_urlsafe(24),
}


@dataclass(frozen=True)
class StackPaths:
    """Where each part of the stack keeps its state, below one folder."""

    root: Path

    @property
    def secrets(self) -> Path:
        return self.root / "secrets.env"

    @property
    def state(self) -> Path:
        return self.root / "stack.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def postgres(self) -> Path:
        return self.root / "postgres"   # data/ and socket/ inside, both owned by the postgres user

    def home(self, part: str) -> Path:
        """A part's own working folder (Prefect's home for the server and each worker, MLflow's auth config)."""
        return self.root / "home" / part


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600 from the first byte), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)   # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines (no quoting: every value here is URL-safe text, moto's keys included)."""
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def load_secrets(paths: StackPaths, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The stack's secrets: those already in the file, any missing one generated, `extra` merged in; the file is
    (re)written 0600 only when something changed."""
    stored = read_env_file(paths.secrets)
    merged = {**{name: stored.get(name) or make() for name, make in GENERATED.items()}, **stored, **(extra or {})}
    if merged != stored:
        body = "".join(f"{name}={value}\n" for name, value in merged.items())
        write_private(paths.secrets, "# the team stack's generated secrets: never print, commit or copy this file\n"
                                     + body)
    os.chmod(paths.secrets, 0o600)   # a copy or an editor may have widened it
    return merged


@dataclass
class StackState:
    """stack.json: the ports (chosen at the first up, kept after) and each running process (pid, start time)."""

    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, dict[str, float]] = field(default_factory=dict)
    workers: int = 0

    @classmethod
    def load(cls, paths: StackPaths) -> StackState:
        if not paths.state.exists():
            return cls()
        raw = json.loads(paths.state.read_text())
        return cls(raw.get("ports", {}), raw.get("processes", {}), raw.get("workers", 0))

    def save(self, paths: StackPaths) -> None:
        text = json.dumps({"ports": self.ports, "processes": self.processes, "workers": self.workers}, indent=2)
        write_private(paths.state, text + "\n")


def process_start_time(pid: int) -> float | None:
    """The process's start time (psutil's create_time), None if it does not run (or is a zombie)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
    except psutil.Error:
        return None


def is_running(record: dict[str, float] | None) -> bool:
    """The recorded process still runs: same pid and same start time (a reused pid is someone else's)."""
    if not record:
        return False
    started = process_start_time(int(record["pid"]))
    return started is not None and abs(started - record["started"]) < 1.0


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants, MiB (shared pages counted in each)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for process in tree:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total / 2**20


def stop_group(record: dict[str, float], timeout_s: float, first: int = signal.SIGTERM) -> None:
    """Stop a recorded process and its process group (each part starts in a session of its own): `first`, then
    SIGKILL after `timeout_s`. Nothing happens when it no longer runs."""
    if not is_running(record):
        return
    pid = int(record["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, first)
    deadline = time.monotonic() + timeout_s
    while is_running(record) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_running(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while is_running(record) and time.monotonic() < deadline:
            time.sleep(0.1)
    if is_running(record):
        raise TorchshipError(f"process {pid} did not stop after SIGKILL; stop it by hand (kill -9 {pid}).")
