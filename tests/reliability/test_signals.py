"""A command that starts children stops them all when it is stopped, by SIGTERM (`kill`, a supervisor) as by
SIGINT (Ctrl-C): no service, MLflow or Prefect process outlives it. Real processes, bounded waits. The end-to-end
cases are in tests/integration/test_cli.py (`torchship ui` and `torchship run` stopped by SIGTERM)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration
STOP_S = 60.0


def _stop_and_check(command: psutil.Popen, signum: int) -> None:
    """Send `signum` to the command alone (as `kill` does); it and every descendant must be gone in time."""
    descendants = command.children(recursive=True)
    assert descendants, "the command started no children"
    command.send_signal(signum)
    command.wait(timeout=STOP_S)
    gone, alive = psutil.wait_procs(descendants, timeout=STOP_S)
    assert alive == [], f"still running after {signum!r}: {[(p.pid, p.name()) for p in alive]}"


# What every command that starts a child does (the bless and canary service, `torchship demo`, the UIs):
# start it in its own session and hold it under `running`.
PARENT = """
import sys, time
from pathlib import Path
from tasks.core.procs import running, start_child
child = start_child("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], Path(sys.argv[1]))
with running([child]):
    print(child.process.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_command_holding_children_stops_them_on_either_signal(tmp_path, signum):
    # SIGINT as a terminal's Ctrl-C delivers it: a shell running a job in the background (as CI may run the
    # suite) starts it with SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all.
    command = psutil.Popen([sys.executable, "-c", PARENT, str(tmp_path / "sleeper.log")], cwd=REPO,
                           stdout=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        child = psutil.Process(int(command.stdout.readline()))
        _stop_and_check(command, signum)
        assert not child.is_running()
    finally:
        for process in [command, *command.children(recursive=True)] if command.is_running() else []:
            process.kill()


# The train stage (`python -m tasks.train`, as `dvc repro` runs it) launching a torchrun job whose worker sleeps.
TRAIN_STAGE = """
import sys
from pathlib import Path
from tasks.core.params_spec import TrainParams
from tasks.training.job import TrainingJob
from tasks.training.run import launch
logs = Path(sys.argv[1])
launch(TrainingJob(stage="t", train=TrainParams(nproc=1), spec={}, weights=logs / "w", checkpoints=logs / "c",
                   folder=logs, logs=logs, module="sleeping_worker"))
"""


def test_the_train_stage_stopped_alone_stops_torchrun_and_its_workers(tmp_path):
    (tmp_path / "sleeping_worker.py").write_text("import time\nprint('training', flush=True)\ntime.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    stage = psutil.Popen([sys.executable, "-c", TRAIN_STAGE, str(tmp_path / "logs")], cwd=tmp_path, env=env,
                         stderr=subprocess.DEVNULL)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + STOP_S   # bounded: torchrun up and its worker running
        while not any("sleeping_worker" in " ".join(p.cmdline()) for p in tree if p.is_running()):
            assert stage.poll() is None and time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
            tree = stage.children(recursive=True)
        _stop_and_check(stage, signal.SIGTERM)
    finally:   # orphans (the failure this test catches) are no longer the stage's children: kill all it had
        for process in [stage, *tree]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


# A run holding the workspace that starts a child in a session of its own (as `dvc repro` and the services are).
HOLDER = """
import sys, time
from pathlib import Path
from prefect import flow
from tasks.workspace.lock import workspace_lock
from tasks.core.procs import start_child

@flow
def hold():
    with workspace_lock("a killed run", 5):
        child = start_child("stage", [sys.executable, "-c", "import time; time.sleep(600)"], Path("stage.log"))
        Path("held").write_text(str(child.process.pid))
        time.sleep(600)
hold()
"""


@pytest.mark.timeout(300)
def test_a_run_killed_alone_leaves_nothing_working_once_the_next_takes_the_workspace(tmp_path, prefect_server,
                                                                                      monkeypatch):
    """`kill -9` of the holder's PID alone (not its tree): its child in a session of its own lives on, and would
    write beside the next run; the next run stops it before it takes the workspace."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.workspace.lock import workspace_lock

    api = prefect_server.api_url()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PREFECT_API_URL": api,
           "PYTHONPATH": str(REPO)}
    holder = psutil.Popen([sys.executable, "-c", HOLDER], cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    stage = None
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "held").exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder never took the workspace"
            time.sleep(0.1)
        stage = psutil.Process(int((tmp_path / "held").read_text()))
        holder.kill()
        holder.wait(timeout=30)
        assert stage.is_running()                                    # orphaned, working on
        monkeypatch.chdir(tmp_path)
        with temporary_settings({PREFECT_API_URL: api}), workspace_lock("the next run", 30):
            assert not stage.is_running() or stage.status() == psutil.STATUS_ZOMBIE
    finally:
        for process in (holder, stage):
            with contextlib.suppress(psutil.NoSuchProcess, AttributeError):
                process.kill()
