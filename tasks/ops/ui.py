"""`torchship ui`: the MLflow UI and the Prefect UI as child processes on 127.0.0.1, started in their own
sessions, ready when their health endpoints answer, stopped by PID on every way out."""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tasks.config import TrackingParams
from tasks.core.errors import TorchshipError
from tasks.core.procs import Child, http_ok, running, start_child, wait_until_ready

STARTUP_TIMEOUT_S = 120.0  # Prefect's server migrates its database on a first start


@dataclass(frozen=True)
class UiServer:
    name: str            # MLflow | Prefect
    url: str             # what the user opens
    health: str          # answers 200 once the server is ready
    command: list[str]


def ui_servers(tracking: TrackingParams, mlflow_port: int, prefect_port: int) -> list[UiServer]:
    """The two servers, run from this interpreter's environment."""
    bin_dir = Path(sys.executable).parent
    mlflow_url, prefect_url = f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{prefect_port}"
    return [
        UiServer("MLflow", mlflow_url, f"{mlflow_url}/health",
                 [str(bin_dir / "mlflow"), "server", "--backend-store-uri", tracking.resolved_uri(),
                  "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"]),
        UiServer("Prefect", prefect_url, f"{prefect_url}/api/health",
                 [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)]),
    ]


@contextlib.contextmanager
def running_servers(servers: list[UiServer], logs: Path,
                    timeout: float = STARTUP_TIMEOUT_S) -> Iterator[list[Child]]:
    """Start every server (output to `logs/<name>.log`), wait until all answer, and stop them all on the way
    out, whatever happens inside (an error, Ctrl-C, or SIGTERM under `sigterm_raises`)."""
    children: list[Child] = []
    with running(children):
        for server in servers:
            children.append(start_child(f"{server.name} UI", server.command, logs / f"{server.name.lower()}.log"))
        for server, child in zip(servers, children):
            wait_until_ready(child, http_ok(server.health), timeout)
        yield children


def serve_until_stopped(children: list[Child], poll_s: float = 0.5) -> None:
    """Block until interrupted (Ctrl-C, or SIGTERM under `sigterm_raises`); a server that exits on its own
    is an error."""
    while True:
        for child in children:
            if child.process.poll() is not None:
                raise TorchshipError(f"{child.name} stopped on its own (exit {child.process.returncode}); "
                                     f"its output is in {child.log}:\n{child.output_tail(800)}")
        time.sleep(poll_s)
