"""The CLI through the real `torchship` executable, as a user meets it: the service started and stopped by PID,
the UIs (one start: both answer on loopback, and are gone after SIGTERM), and a run stopped by SIGTERM putting
params.yaml back. Version, status, help texts, rollback, clean and error rendering run in-process
in test_cli_inprocess.py; every other test that calls `project.torchship` starts the real executable too."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tasks.core.procs import Child, free_port, http_ok, start_child, wait_until_ready
from tests.conftest import BIN, make_project

pytestmark = pytest.mark.integration
MODEL = "synthetic-churn"


def start_torchship(project, log: Path, *args: str) -> Child:
    """`torchship ARGS` in the project as its own process group, output to `log` (the environment as
    Project.torchship builds it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return start_child(f"torchship {args[0]}", [str(BIN / "torchship"), *args], log, env=env, cwd=project.root)


def test_serve_answers_with_the_champion_and_stops_by_pid(tiny_pipeline, tmp_path):
    project, _ = tiny_pipeline
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = start_torchship(project, tmp_path / "serve.log", "serve", "--port", str(port))
    try:
        wait_until_ready(service, http_ok(f"{url}/health", accept=lambda health: bool(health.get("champion"))), 120)
        health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 200
        assert str(health.json()["champion"]) == project.registry(MODEL)["aliases"]["champion"]
    finally:
        service.stop()
    assert service.process.poll() is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


def _gone(pid: int) -> bool:
    """No process is left in the group `pid` leads (servers start in their own sessions)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ui_stops_both_servers_on_sigterm(fresh_project, tmp_path):
    project = fresh_project
    ports = {"MLflow": free_port(), "Prefect": free_port()}
    ui = start_torchship(project, tmp_path / "ui.log", "ui", "--mlflow-port", str(ports["MLflow"]),
                         "--prefect-port", str(ports["Prefect"]))
    try:
        def both_ready() -> bool:
            return len(re.findall(r"ready .* \(pid (\d+)\)", ui.output_tail(10_000))) == 2

        wait_until_ready(ui, both_ready, timeout=240, interval=0.5)
        servers = {name: int(pid) for name, pid in re.findall(r"ready (\w+) .* \(pid (\d+)\)", ui.output_tail(10_000))}
        assert set(servers) == {"MLflow", "Prefect"}
        for name, port in ports.items():   # each answers on loopback, at the address it printed
            assert f"http://127.0.0.1:{port}" in ui.output_tail(10_000)
            assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code < 500, name
        os.kill(ui.process.pid, signal.SIGTERM)  # torchship itself, not its group: its handler must stop both
        ui.process.wait(timeout=60)
    finally:
        ui.stop()
    assert "stopped both UIs (SIGTERM)" in ui.output_tail(), ui.output_tail()
    assert ui.process.returncode == 0
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in servers.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [name for name, pid in servers.items() if not _gone(pid)] == []
    for port in ports.values():
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)


def _stage_processes(root: Path, within: float = 15.0) -> list[str]:
    """Command lines of DVC stage processes (`dvc repro`, `python -m tasks.<stage>`, torchrun) still working
    in `root` once `within` seconds have passed (a process may take a moment to exit after SIGTERM)."""
    deadline = time.monotonic() + within
    while True:
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if Path(os.readlink(proc / "cwd")) == root and any(
                        marker in command for marker in ("dvc repro", "-m tasks.", "torchrun")):
                    found.append(command)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_run_stopped_by_sigterm_puts_params_back(tmp_path):
    project = make_project(tmp_path / "project")
    before = {name: (project.root / name).read_bytes() for name in ("params.yaml", "data/source.json")}
    run = start_torchship(project, tmp_path / "run.log", "run", "--set", "train.epochs=3",
                          "--set", "data.source=sklearn:iris", "--set", "data.target=null")
    try:
        wait_until_ready(run, lambda: "── prepare" in run.output_tail(), timeout=120, interval=0.2)
        assert "source: sklearn:iris" in (project.root / "params.yaml").read_text(), "the override was not applied"
        os.kill(run.process.pid, signal.SIGTERM)  # torchship itself, as a supervisor would
        run.process.wait(timeout=60)
    finally:
        run.stop()
    assert run.process.returncode == 143, run.output_tail()
    assert "stopped: params.yaml is as it was" in run.output_tail()
    assert _stage_processes(project.root) == [], "the DVC stage it started is still running"
    assert {name: (project.root / name).read_bytes() for name in before} == before
