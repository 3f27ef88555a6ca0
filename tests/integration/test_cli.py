"""The CLI as a user meets it: help, version, status, rollback, the UIs."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_help_and_version(tiny_pipeline):
    project, _ = tiny_pipeline
    assert project.torchship("--version").stdout.startswith("torchship ")
    for command in ("run", "plan", "ui", "serve", "status", "rollback", "clean"):
        result = project.torchship(command, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, command


def test_status_shows_the_champion(tiny_pipeline):
    project, _ = tiny_pipeline
    champion = project.registry("synthetic-churn")["aliases"]["champion"]
    result = project.torchship("status")
    assert result.returncode == 0, result.stderr
    assert f"champion → v{champion}" in result.stdout


def test_ui_starts_mlflow_and_prefect_on_loopback(tiny_pipeline):
    project, _ = tiny_pipeline
    mlflow_port, prefect_port = _free_port(), _free_port()
    result = project.torchship("ui", "--check", "--mlflow-port", str(mlflow_port), "--prefect-port", str(prefect_port),
                               timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"http://127.0.0.1:{mlflow_port}" in result.stdout
    assert f"http://127.0.0.1:{prefect_port}" in result.stdout
