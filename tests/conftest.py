"""Shared fixtures: tiny seeded data, and one tiny pipeline run per test session in a project copy."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# Before torch or scikit-learn load (they read it once), in this process and every child a test starts: the
# xdist workers share two cores, and an OpenMP pool of two threads a process (scikit-learn's boosting, torch's
# intra-op work) spin-waits for a core it does not get. With one thread a process a tiny pipeline run took 14% less
# CPU beside a busy suite (157 vs 183 CPU-s), its baseline stage 4.8x less (7 vs 34).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tasks.core.env import FILE_LEASES, LEASE_STORAGE_ENV  # noqa: E402
from tasks.core.procs import free_port, http_ok, start_child  # noqa: E402
from tests.helpers import cpu_time  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

TINY = {  # every key here is one the default models really read (params are airtight)
    "data": {"rows": 3000},
    "validate": {"min_rows": 50},
    # adapt off: the tiny table would otherwise get its full step budget (tests/model/test_adapt.py covers it)
    # one thread a process, as OMP_NUM_THREADS above: torchrun's workers and ONNX Runtime choose their own
    "runtime": {"threads": 1},
    "train": {"model": "ft_transformer", "adapt": False, "epochs": 2, "batch_size": 256, "threads": 1,
              "model_args": {"ft_transformer": {"d_token": 8, "layers": 1, "heads": 2}}},
    "distill": {"epochs": 2, "hidden": [16]},
    # inductor compiles cost ~30 s a run and dynamo exports ~4 s each: the session's pipeline keeps both on
    "export": {"probe_rows": 64, "compile": False, "onnx_exporter": "legacy"},
    "compress": {"bootstrap": 200},
    "profile": {"rounds": 30, "throughput_seconds": 0.1},
    # a canary judged on 20 challenger requests per step over two steps, from 60 replayed rows (the defaults replay
    # up to 5,000: enough labelled pairs to call a drop of max_metric_drop significant)
    "canary": {"requests": 60, "min_samples": 20, "steps": [0.5, 1.0]},
    # a 2-epoch tiny model is no match for scikit-learn: only the baseline gate's own tests use the real gap
    "bless": {"max_baseline_gap": 1.0, "latency_rounds": 100, "bootstrap": 200},
    "slo": {"bless_requests": 100, "p99_ms": 1000},   # a busy CI box must not fail the tiny run's SLO
}


SUITES = ("unit", "data", "model", "integration", "reliability")
IN_MEMORY = ("unit", "data", "model")
# The modules that take minutes (the CPU report `make test` prints), longest first: each starts before the rest of
# its start class (below), so that none is left running alone on one worker at the end while the others idle. Only
# the order changes with this list: a module missing from it runs all the same, in collection order.
LONGEST_FIRST = ("integration/test_journey", "integration/test_images_stack", "integration/test_images",
                 "integration/test_text", "reliability/test_kill_ladder", "integration/test_pipeline",
                 "reliability/test_contract_doors", "integration/test_training_engine", "integration/test_cli",
                 "integration/test_small_table", "integration/test_two_nodes", "integration/test_sweep_stack",
                 "integration/test_stack")
SHARED_BUILD_TIMEOUT_S = 1200


def xdist_group_in_nodeid(item) -> None:
    """What pytest-xdist 3.8 does on a worker under --dist loadgroup, for pytest 9.2: it writes the group into
    `item._nodeid` ("<nodeid>@<group>", which the controller splits into work units), but pytest 9.2 reads a node's
    id from `item._id`, so the group never reached the controller and the tests of one group ran on several
    workers. (Once xdist writes `_id` itself, its suffix comes second and the controller reads the last one.)"""
    from _pytest.nodeid import NodeId

    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Each test carries the marker of the folder it lives in (tests/<suite>/...): `make test-fast` selects unit,
    data and model; integration and reliability run real processes and servers.

    Under `pytest -n N --dist loadgroup`, the tests of one module run on one worker (they share its module
    fixtures: a service, a project), unless a test names its own `xdist_group`. Workers take modules in this
    order: first those that build projects of their own (while the first worker to need it builds the shared
    tiny pipeline), then those on the tiny pipeline, then the in-memory suites, which fill the gaps at the end;
    within each of the first two, the LONGEST_FIRST modules first."""
    for item in items:
        suite = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        if suite in SUITES:
            item.add_marker(suite)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(Path(item.nodeid.split("::")[0]).with_suffix("").as_posix()
                                                    .removeprefix("tests/")))   # unit/test_gate
        if "tiny_pipeline" in item.fixturenames:
            # a worker's first test on the shared pipeline builds it or waits for another worker to (~5 min alone on
            # 2 cores, more beside the other workers), in its setup: twice the usual 600 s, or its own if longer
            own = item.get_closest_marker("timeout")
            seconds = max(SHARED_BUILD_TIMEOUT_S, own.args[0] if own and own.args else 0)
            item.add_marker(pytest.mark.timeout(seconds), append=False)
        if getattr(config.option, "loadgroup", False) and hasattr(item, "_id"):   # an xdist worker, pytest >= 9.2
            xdist_group_in_nodeid(item)

    def start_order(item) -> tuple[int, int]:
        if any(item.get_closest_marker(suite) for suite in IN_MEMORY):
            return 2, 0
        rank = LONGEST_FIRST.index(module_of(item)) if module_of(item) in LONGEST_FIRST else len(LONGEST_FIRST)
        return (1 if "tiny_pipeline" in item.fixturenames else 0), rank

    # A module goes where its first test goes, whole: its tests keep their order (a module's fixtures may depend on
    # it: test_stack.py takes its stack down last).
    orders: dict[str, tuple[int, int]] = {}
    for item in items:
        orders.setdefault(module_of(item), start_order(item))
    items.sort(key=lambda item: orders[module_of(item)])   # stable


def module_of(item) -> str:
    """integration/test_cli: the module's path under tests/, as LONGEST_FIRST names it."""
    return Path(item.nodeid.split("::")[0]).with_suffix("").as_posix().removeprefix("tests/")


def pytest_configure(config) -> None:
    cpu_time.start()


def pytest_unconfigure(config) -> None:
    cpu_time.finish()


@pytest.hookimpl(tryfirst=True)   # before its fixtures are set up: they are counted with the test
def pytest_runtest_setup(item) -> None:
    cpu_time.enter(Path(str(item.fspath)).relative_to(REPO / "tests").with_suffix("").as_posix())


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
    terminalreporter.write_sep("-", "CPU by suite and module (tests/helpers/cpu_time.py)")
    cpu_time.report(terminalreporter.write_line)


@dataclass
class PrefectServer:
    """A real `prefect server start` on 127.0.0.1, started early and waited for only when first used (it comes up
    while the first pipeline runs): each `torchship run` against it skips the ~6 s an ephemeral API costs to
    start, and the scale-out mode (PREFECT_API_URL) is exercised too."""

    url: str
    pid: int
    log: Path

    def api_url(self) -> str:
        deadline = time.monotonic() + 120
        while not self.answers():
            assert alive(self.pid), f"the Prefect server exited during start-up:\n{self.output_tail()}"
            assert time.monotonic() < deadline, f"the Prefect server did not answer in 120 s:\n{self.output_tail()}"
            time.sleep(0.5)
        return self.url

    def answers(self) -> bool:
        with contextlib.suppress(Exception):   # not listening yet
            return http_ok(f"{self.url}/health")()
        return False

    def output_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_prefect_server(home: Path, settings: dict[str, str] | None = None) -> PrefectServer:
    """`prefect server start` on a free port with its own SQLite database in `home` (and `settings`, PREFECT_*
    variables of the server's own), in its own session (stopped by PID: `stop_prefect_server`)."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PREFECT_HOME": str(home),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true",
           # leases on disk, as every server torchship starts keeps them (tasks/core/env.py prefect_state, the stack)
           LEASE_STORAGE_ENV: FILE_LEASES, **(settings or {})}
    child = start_child("prefect server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                           "--port", str(port)], home / "server.log", env=env)
    return PrefectServer(f"http://127.0.0.1:{port}/api", child.process.pid, child.log)


def stop_prefect_server(server: PrefectServer) -> None:
    """SIGTERM to the server's process group, SIGKILL after 15 s (it is not this process's child on a worker that
    did not start it: no wait(), just watch the PID)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(server.pid, signal.SIGKILL)


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

    def python(self, code: str, env: dict[str, str] | None = None) -> str:
        """Run code in a separate interpreter in the project (e.g. an independent MLflow client), in this
        process's environment unless given one."""
        result = subprocess.run([sys.executable, "-c", code], cwd=self.root, capture_output=True, text=True,
                                timeout=300, env={**(env or os.environ), "MLFLOW_DISABLE_TELEMETRY": "true"})
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def registry(self, name: str) -> dict:
        """Versions, tags and aliases, read in this process by an MLflow client on the project's SQLite store
        (by absolute URI, so no global MLflow state is set; a fresh interpreter per read cost ~3 s)."""
        from mlflow import MlflowClient

        uri = f"sqlite:///{self.root / 'mlflow' / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        versions = client.search_model_versions(f"name='{name}'")
        aliases = {k: str(v) for k, v in client.get_registered_model(name).aliases.items()} if versions else {}
        return {"aliases": aliases, "versions": {str(v.version): dict(v.tags) for v in versions}}

    def dvc(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=self.root, capture_output=True, text=True,
                              timeout=300)


def make_project(target: Path, overrides: dict | None = None, tiny: bool = True,
                 prefect: PrefectServer | None = None) -> Project:
    """Copy the git-tracked files, apply the tiny params (unless `tiny` is off: benchmarks) and the
    overrides, and commit, like a fresh clone."""
    from tasks.stages.overrides import merge

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


SHARED_SERVER = "prefect-server.json"


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> PrefectServer:
    """One server for the whole test run, however many xdist workers ask: the first starts it (under a file lock),
    the others read its address; the controller stops it when the run ends (pytest_sessionfinish). Three idle
    servers, one per worker, cost two start-ups and a steady share of the two cores."""
    from filelock import FileLock

    folder = run_folder(tmp_path_factory)
    record = folder / SHARED_SERVER
    with FileLock(f"{record}.lock"):
        if not record.exists():
            home = folder / "prefect-server"
            home.mkdir(exist_ok=True)
            server = start_prefect_server(home)
            record.write_text(json.dumps({"url": server.url, "pid": server.pid, "log": str(server.log)}))
    saved = json.loads(record.read_text())
    return PrefectServer(saved["url"], saved["pid"], Path(saved["log"]))


TEAM_STACK_GROUP = "team-stack"   # the xdist group of the modules on the shared `torchship stack` (below)


@pytest.fixture(scope="session")
def team_stack():
    """One `torchship stack`'s folder for the modules of the TEAM_STACK_GROUP (the journey, the image loop beside it,
    then test_stack.py's checks, which end with its `down`), on one worker: a stack's start-up (PostgreSQL, moto,
    MLflow's and Prefect's servers and their migrations) is ~25 CPU-s on two busy cores. Each module runs `up` first,
    which starts only what is not running. Stopped and removed on every way out. Not under pytest's tmp_path: its
    base is 0700, and PostgreSQL runs as another user that must traverse it."""
    import shutil
    import tempfile

    from flows.cli.stack.lifecycle import stack_down
    from flows.cli.stack.state import StackPaths
    from tests.helpers.stack import require_parts

    require_parts()
    paths = StackPaths(Path(tempfile.mkdtemp(prefix="torchship-stack-", dir="/tmp")))
    paths.root.chmod(0o711)
    try:
        yield paths
    finally:
        with contextlib.suppress(Exception):
            stack_down(paths, os.environ)
        shutil.rmtree(paths.root, ignore_errors=True)


def pytest_sessionfinish(session) -> None:
    """The controller (or a run without workers) stops the shared server once every worker is done."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    record = factory.getbasetemp() / SHARED_SERVER if factory is not None else None
    if record is not None and record.exists():
        saved = json.loads(record.read_text())
        stop_prefect_server(PrefectServer(saved["url"], saved["pid"], Path(saved["log"])))


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
        f"    access_key_id = {SECRETS['AWS_ACCESS_KEY_ID']}\n"
        f"    secret_access_key = {SECRETS['AWS_SECRET_ACCESS_KEY']}\n"
        "['remote \"web\"']\n    url = https://dvc.invalid/store\n    auth = basic\n    user = torchship\n"
        f"    password = {DVC_REMOTE_PASSWORD}\n")


def run_folder(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this test run shares: the controller's basetemp, which holds each
    worker's own (popen-gwN); without xdist, this session's basetemp."""
    basetemp = tmp_path_factory.getbasetemp()
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def build_tiny_pipeline(folder: Path) -> None:
    """The tiny pipeline's first run, as `make pipeline` does it (an ephemeral Prefect API), into
    folder/project; its output goes to folder/first-run.json, whether it passed or not."""
    project = make_project(folder / "project", {"export": {"compile": True, "onnx_exporter": "dynamo"}})
    plant_dvc_credentials(project)
    first = project.torchship("run", env=SECRET_ENV)
    (folder / "first-run.json").write_text(json.dumps(
        {"args": first.args, "returncode": first.returncode, "stdout": first.stdout, "stderr": first.stderr}))


def repoint_mlflow_store(root: Path, old_root: Path) -> None:
    """MLflow keeps absolute artifact locations (experiments, runs, model version sources) in its database:
    a copied project's must name its own artifacts, or its writes would land in the original."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(root / "mlflow" / "mlflow.db")) as db, db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for column in [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')
                           if any(kind in row[2].upper() for kind in ("CHAR", "TEXT", "CLOB"))]:
                db.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) WHERE instr("{column}", ?)',
                           (str(old_root), str(root), str(old_root)))


def copy_project(source: Path, target: Path, prefect: PrefectServer | None = None) -> Project:
    """A copy of a project with its DVC cache, remote, registry and Prefect state, that writes only to itself."""
    shutil.copytree(source, target, symlinks=True)
    repoint_mlflow_store(target, source)
    return Project(target, prefect)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory, prefect_server) -> tuple[Project, subprocess.CompletedProcess]:
    """One full pipeline run on tiny params, shared by the integration tests. It runs once per test run, under
    a file lock, however many xdist workers ask (the first builds it, the others wait), as a user's shell would
    give it secrets: an admin token, MLflow and cloud credentials in the environment, DVC remote credentials in
    .dvc/config.local (none may leak: test_secrets.py). Each worker's session gets its own copy, so tests that
    change the project (and put it back after) never meet another worker's changes; later runs there use the
    session's Prefect server."""
    from filelock import FileLock

    built = run_folder(tmp_path_factory) / "tiny-pipeline"
    with FileLock(f"{built}.lock"):
        if not (built / "first-run.json").exists():
            built.mkdir(exist_ok=True)
            build_tiny_pipeline(built)
    first = subprocess.CompletedProcess(**json.loads((built / "first-run.json").read_text()))
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    project = copy_project(built / "project", tmp_path_factory.mktemp("tiny-pipeline") / "project", prefect_server)
    return project, first


@pytest.fixture
def fresh_project(tmp_path) -> Project:
    return make_project(tmp_path)


@pytest.fixture(scope="session")
def customers():
    from tasks.modalities.table.sources import generate_customers

    return generate_customers(1500, seed=3)
