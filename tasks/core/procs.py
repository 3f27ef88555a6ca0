"""Child processes: start one in its own process group, wait until it answers, stop it by PID (the whole
group, on any exit path), and copy its output while keeping the tail for error messages."""
from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tasks.core.env import UNBUFFERED
from tasks.core.errors import TorchshipError


def tee_lines(stream, tail: collections.deque, echo) -> None:
    """Copy a text stream to `echo`, keeping its last lines in `tail`."""
    for line in stream:
        tail.append(line.rstrip("\n"))
        echo.write(line)
        echo.flush()


def exit_without_teardown(code: int = 0) -> None:
    """End this process now, as a normal exit would but without the interpreter unloading every module: threading's
    exit callbacks run and the threads that are not daemons joined (the interpreter's own first step, `threading.
    _shutdown`: it tells idle thread pools, such as MLflow's artifact uploads and Prefect's workers, to stop; joining
    them without it waits forever), exit handlers run, logs and output flushed, then os._exit. A process that holds
    torch, MLflow, pandas and scikit-learn spent 1.5-3 s on 2 cores unloading them after its work was done."""
    import atexit
    import logging

    if threading.current_thread() is threading.main_thread():
        threading._shutdown()
    else:   # not the interpreter's way out: join what is left
        for thread in threading.enumerate():
            if thread not in (threading.main_thread(), threading.current_thread()) and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass
class Child:
    """A started child process whose output goes to a file (never a pipe nobody reads: a full pipe blocks it)."""

    name: str
    process: subprocess.Popen
    log: Path

    def output_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to its whole process group, then SIGKILL if it has not exited within `timeout`."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout)


def start_child(name: str, command: list[str], log: Path, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> Child:
    """Start `command` in a new session (so stopping it stops its own children too), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   start_new_session=True, text=True)
    return Child(name, process, log)


def wait_until_ready(child: Child, ready: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    """Poll `ready()` until it is true; fail with the child's own last output if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while True:
        if child.process.poll() is not None:
            raise TorchshipError(f"{child.name} exited during start-up (exit {child.process.returncode}):\n"
                                 f"{child.output_tail()}")
        with contextlib.suppress(Exception):  # not listening yet, or answering 503 while it loads
            if ready():
                return
        if time.monotonic() > deadline:
            raise TorchshipError(f"{child.name} did not become ready within {timeout:g} s; its output is in "
                                 f"{child.log}:\n{child.output_tail(800)}")
        time.sleep(interval)


def http_ok(url: str, accept: Callable[[object], bool] | None = None) -> Callable[[], bool]:
    """A readiness probe: GET `url` answers 200 (and its JSON passes `accept`, when given)."""
    import httpx

    def probe() -> bool:
        response = httpx.get(url, timeout=1.0)
        return response.status_code == 200 and (accept is None or accept(response.json()))

    return probe


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM; exits with 143 (128 + SIGTERM) unless caught."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside: the first SIGTERM raises Terminated (as SIGINT raises KeyboardInterrupt), later ones are ignored
    (so the clean-up it starts is not cut short); the previous handler is back afterwards. Only the main thread
    can handle signals: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_once(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def running(children: list[Child]) -> Iterator[list[Child]]:
    """Stop every child on the way out, whatever happened inside (an exception, SIGINT, or SIGTERM: without
    this a SIGTERM would end the process at once and leave its children, in their own sessions, running)."""
    with sigterm_raises():
        try:
            yield children
        finally:
            for child in children:
                child.stop()


@contextlib.contextmanager
def running_service(model_name: str, flags: list[str], startup_timeout_s: float, prefix: str,
                    env: dict[str, str] | None = None) -> Iterator[str]:
    """A real `python -m serving` process on a free loopback port (`env` added to this process's environment),
    ready once /health names a champion; stopped by PID (its whole process group) on every way out. Yields its
    base URL."""
    import tempfile

    port = free_port()
    command = [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", str(port), "--model-name", model_name,
               *flags]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        service = start_child("the service", command, Path(folder) / "service.log",
                              env={**os.environ, **UNBUFFERED, **(env or {})})
        with running([service]):
            wait_until_ready(service, http_ok(f"{url}/health", accept=lambda health: bool(health.get("champion"))),
                             startup_timeout_s)
            yield url
