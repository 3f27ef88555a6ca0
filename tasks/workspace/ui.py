"""`torchship ui`: the MLflow UI and the Prefect UI. A server the configuration points at (a tracking URI over
HTTP, PREFECT_API_URL) is only named: the team's server is the one to open, and a second one on the same port
would collide with it. Only the embedded default's servers are started here, as child processes on 127.0.0.1
in their own sessions, ready when their health endpoints answer, stopped by PID on every way out."""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tasks.core.env import MLFLOW_STORE_ENV, PREFECT_API_URL, PREFECT_UI_URL
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import TrackingParams
from tasks.core.procs import Child, http_ok, running, start_child, wait_until_ready

STARTUP_TIMEOUT_S = 120.0  # Prefect's server migrates its database on a first start


@dataclass(frozen=True)
class UiServer:
    name: str            # MLflow | Prefect
    url: str             # what the user opens
    health: str = ""     # answers 200 once a started server is ready
    command: tuple[str, ...] = ()   # empty: a configured remote server, nothing to start
    env: tuple[tuple[str, str], ...] = ()   # added to the child's environment

    @property
    def remote(self) -> bool:
        return not self.command


def without_userinfo(url: str) -> str:
    """`url` without a `user:password@` part: an address may be printed, a credential never."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=host))


def prefect_ui_url(environ: Mapping[str, str]) -> str | None:
    """The configured Prefect server's UI (PREFECT_UI_URL, else the API URL less `/api`, as Prefect infers
    it); None in the embedded default."""
    api_url = environ.get(PREFECT_API_URL, "").rstrip("/")
    if not api_url:
        return None
    ui_url = environ.get(PREFECT_UI_URL) or api_url.removesuffix("/api")
    return without_userinfo(ui_url)


def mlflow_ui_url(tracking: TrackingParams) -> str | None:
    """The tracking server's address when `tracking.uri` is one (http/https); None for a store opened here."""
    return without_userinfo(tracking.uri) if urlsplit(tracking.uri).scheme in ("http", "https") else None


def ui_servers(tracking: TrackingParams, mlflow_port: int, prefect_port: int,
               environ: Mapping[str, str]) -> list[UiServer]:
    """The two servers: each one either configured (remote: named, not started) or started from this
    interpreter's environment on 127.0.0.1 (the embedded default)."""
    bin_dir = Path(sys.executable).parent
    servers = []
    if remote := mlflow_ui_url(tracking):
        servers.append(UiServer("MLflow", remote))
    else:
        url = f"http://127.0.0.1:{mlflow_port}"
        # The store URI goes through the environment: a database URI may hold a password (not for /proc/*/cmdline).
        servers.append(UiServer("MLflow", url, f"{url}/health",
                                (str(bin_dir / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
                                 "--workers", "1"), ((MLFLOW_STORE_ENV, tracking.resolved_uri()),)))
    if remote := prefect_ui_url(environ):
        servers.append(UiServer("Prefect", remote))
    else:
        url = f"http://127.0.0.1:{prefect_port}"
        servers.append(UiServer("Prefect", url, f"{url}/api/health",
                                (str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1",
                                 "--port", str(prefect_port))))
    return servers


@contextlib.contextmanager
def running_servers(servers: list[UiServer], logs: Path, environ: Mapping[str, str],
                    timeout: float = STARTUP_TIMEOUT_S) -> Iterator[list[Child]]:
    """Start every server (output to `logs/<name>.log`), wait until all answer, and stop them all on the way
    out, whatever happens inside (an error, Ctrl-C, or SIGTERM under `sigterm_raises`)."""
    children: list[Child] = []
    with running(children):
        for server in servers:
            children.append(start_child(f"{server.name} UI", list(server.command),
                                        logs / f"{server.name.lower()}.log", env={**environ, **dict(server.env)}))
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
