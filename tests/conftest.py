"""Shared fixtures: tiny seeded data, and one tiny pipeline run per test session in a project copy."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tasks.core.procs import Child, free_port, http_ok, start_child, wait_until_ready

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

TINY = {  # every key here is one the default models really read (params are airtight)
    "data": {"rows": 3000},
    "validate": {"min_rows": 50},
    # adapt off: the tiny table would otherwise get its full step budget (tests/model/test_adapt.py covers it)
    "train": {"model": "ft_transformer", "adapt": False, "epochs": 2, "batch_size": 256,
              "model_args": {"ft_transformer": {"d_token": 8, "layers": 1, "heads": 2}}},
    "distill": {"epochs": 2, "hidden": [16]},
    # inductor compiles cost ~30 s a run and dynamo exports ~4 s each: the session's pipeline keeps both on
    "export": {"probe_rows": 64, "compile": False, "onnx_exporter": "legacy"},
    "compress": {"bootstrap": 200},
    "profile": {"rounds": 30, "throughput_seconds": 0.1},
    # a canary judged on 20 challenger requests per step over two steps (the defaults need ~1,300 requests)
    "canary": {"requests": 60, "min_samples": 20, "steps": [0.5, 1.0]},
    # a 2-epoch tiny model is no match for scikit-learn: only the baseline gate's own tests use the real gap
    "bless": {"max_baseline_gap": 1.0, "latency_rounds": 100, "bootstrap": 200},
    "slo": {"bless_requests": 100, "p99_ms": 1000},   # a busy CI box must not fail the tiny run's SLO
}


SUITES = ("unit", "data", "model", "integration", "reliability")


def pytest_collection_modifyitems(items) -> None:
    """Each test carries the marker of the folder it lives in (tests/<suite>/...): `make test-fast`
    selects unit, data and model; integration and reliability run real processes and servers."""
    for item in items:
        suite = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        if suite in SUITES:
            item.add_marker(suite)


SUITE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    """Time per suite (setup, call and teardown of its tests; a session fixture counts where it is first used)."""
    suite = Path(report.fspath).parts[1] if Path(report.fspath).parts[0] == "tests" else "other"
    SUITE_SECONDS[suite] = SUITE_SECONDS.get(suite, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if SUITE_SECONDS:
        terminalreporter.write_sep("-", "time by suite")
        for suite, seconds in sorted(SUITE_SECONDS.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{suite:<12} {seconds:8.1f} s")


@dataclass
class PrefectServer:
    """A real `prefect server start` on 127.0.0.1 for the session, started early and waited for only when
    first used (it comes up while the first pipeline runs): each `torchship run` against it skips the ~6 s
    an ephemeral API costs to start, and the scale-out mode (PREFECT_API_URL) is exercised too."""

    child: Child
    url: str

    def api_url(self) -> str:
        wait_until_ready(self.child, http_ok(f"{self.url}/health"), timeout=120, interval=0.5)
        return self.url


@dataclass
class Project:
    """A throwaway clone of this repository with its own DVC, MLflow and Prefect state (an ephemeral
    Prefect API, unless `prefect` points its runs at the session's server)."""

    root: Path
    prefect: PrefectServer | None = None

    def env(self) -> dict[str, str]:
        """The environment a user's shell gives a command here: the venv first, none of this process's
        Prefect/MLflow/pytest settings, and the session's server once the project uses it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        if self.prefect is not None:
            env["PREFECT_API_URL"] = self.prefect.api_url()
        return env

    def torchship(self, *args: str, timeout: float = 900, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "torchship"), *args], cwd=self.root, capture_output=True, text=True,
                              timeout=timeout, env={**self.env(), **(env or {})})

    def python(self, code: str) -> str:
        """Run code in a separate interpreter in the project (e.g. an independent MLflow client)."""
        result = subprocess.run([sys.executable, "-c", code], cwd=self.root, capture_output=True, text=True,
                                timeout=300, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def registry(self, name: str) -> dict:
        """Versions, tags and aliases, read by a fresh MLflow client in another process."""
        out = self.python(
            "import json, mlflow\n"
            "from mlflow import MlflowClient\n"
            "mlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\n"
            "c = MlflowClient()\n"
            f"vs = c.search_model_versions(\"name='{name}'\")\n"
            f"aliases = {{k: str(v) for k, v in c.get_registered_model('{name}').aliases.items()}} if vs else {{}}\n"
            "print(json.dumps({'aliases': aliases, 'versions': {str(v.version): dict(v.tags) for v in vs}}))\n")
        return json.loads(out.strip().splitlines()[-1])

    def dvc(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=self.root, capture_output=True, text=True,
                              timeout=300)


def make_project(target: Path, overrides: dict | None = None, tiny: bool = True,
                 prefect: PrefectServer | None = None) -> Project:
    """Copy the git-tracked files, apply the tiny params (unless `tiny` is off: benchmarks) and the
    overrides, and commit, like a fresh clone."""
    from tasks.ops.overrides import merge

    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    for name in filter(None, files.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    from ruamel.yaml import YAML

    yaml = YAML()
    params = yaml.load((target / "params.yaml").read_text())
    merged = merge(json.loads(json.dumps(params)), merge(TINY if tiny else {}, overrides or {}))
    with (target / "params.yaml").open("w") as handle:
        yaml.dump(merged, handle)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "fixture"]):
        subprocess.run(command, cwd=target, check=True, env=env)
    return Project(target, prefect)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Iterator[PrefectServer]:
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PREFECT_HOME": str(home),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true"}
    child = start_child("prefect server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                           "--port", str(port)], home / "server.log", env=env)
    try:
        yield PrefectServer(child, f"http://127.0.0.1:{port}/api")
    finally:
        child.stop()


SECRETS = {  # fake secrets where real ones live -> values no real code would write by chance
    "TORCHSHIP_ADMIN_TOKEN": "fake-admin-token-5ee1c3a7",
    "MLFLOW_TRACKING_PASSWORD": "fake-mlflow-password-9b2d",
    "MLFLOW_TRACKING_TOKEN": "fake-mlflow-token-41f8e0",
    "AWS_SECRET_ACCESS_KEY": "fake-aws-secret-c0ffee77",
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEY7731",
}
SECRET_ENV = {**SECRETS, "MLFLOW_TRACKING_USERNAME": "torchship"}
DVC_REMOTE_PASSWORD = "fake-dvc-remote-password-77aa"
PLANTED_IN = ".dvc/config.local"      # the one file a secret is meant to be in


def plant_dvc_credentials(project: Project) -> None:
    """Two DVC remotes (not the default one) with their credentials where DVC keeps them: cloud keys and an
    HTTP password in .dvc/config.local (tests/reliability/test_secrets.py looks for them everywhere else)."""
    (project.root / PLANTED_IN).write_text(
        "['remote \"vault\"']\n    url = s3://torchship-fake-bucket/store\n"
        f"    access_key_id = {SECRETS['AWS_ACCESS_KEY_ID']}\n    secret_access_key = {SECRETS['AWS_SECRET_ACCESS_KEY']}\n"
        "['remote \"web\"']\n    url = https://dvc.invalid/store\n    auth = basic\n    user = torchship\n"
        f"    password = {DVC_REMOTE_PASSWORD}\n")


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory, prefect_server) -> tuple[Project, subprocess.CompletedProcess]:
    """One full pipeline run on tiny params, shared by the integration tests of a session. Its first run uses
    the embedded default (an ephemeral Prefect API, as `make pipeline` does); later runs use the server. It
    runs as a user's shell would give it secrets: an admin token, MLflow and cloud credentials in the
    environment, DVC remote credentials in .dvc/config.local (none may leak: test_secrets.py)."""
    project = make_project(tmp_path_factory.mktemp("project"), {"export": {"compile": True, "onnx_exporter": "dynamo"}})
    plant_dvc_credentials(project)
    first = project.torchship("run", env=SECRET_ENV)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    project.prefect = prefect_server
    return project, first


@pytest.fixture
def fresh_project(tmp_path) -> Project:
    return make_project(tmp_path)


@pytest.fixture(scope="session")
def customers():
    from tasks.core.sources import generate_customers

    return generate_customers(1500, seed=3)
