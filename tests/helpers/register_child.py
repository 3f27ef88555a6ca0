"""The register-under-a-fault harness: the real register step (tasks/register.py `run`) in a child process of its
own, on the session's profiled model, paused once its version exists and before the version's tags are written, so
that a test can cause its fault right there (tests/reliability/test_faults_mlflow.py locks the SQLite store,
tests/integration/test_stack.py stops the MLflow server). The child registers twice: round 1 into the fault, round 2
once the test touches `round-2` in the child's folder. It prints `RESULT <round> <json>`: {"registered": outcome}, or
{"<error class>": message} for the failures a user is told to come back from (StoreBusy, TrackingServerDown)."""
from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

from tests.conftest import BIN

REGISTER_TWICE = textwrap.dedent("""
    import json, sys, time, types
    from pathlib import Path
    settings = json.loads(sys.argv[1])
    folder = settings["folder"]
    if settings["sqlite_busy_ms"]:   # MLflow waits 20 s on a locked SQLite database before it gives up
        import mlflow.store.db.utils as db_utils
        from sqlalchemy import sql as _sql
        busy = f"busy_timeout = {settings['sqlite_busy_ms']}"
        db_utils.sql = types.SimpleNamespace(text=lambda q: _sql.text(q.replace("busy_timeout = 20000", busy)))
    from mlflow import MlflowClient
    from tasks import register
    from tasks.config import load_params
    from tasks.core.gate import GateResult
    from tasks.core.verdicts import Blessing, BlessOutcome
    if settings["retry_delays_s"]:
        register.RETRY_DELAYS_S = tuple(settings["retry_delays_s"])
    original = MlflowClient.set_model_version_tag
    def paused(self, *args, **kwargs):   # the version exists, its tags do not: tell the test, wait for its fault
        Path(folder, "at-tags").touch()
        while not Path(folder, settings["release"]).exists():
            time.sleep(0.02)
        MlflowClient.set_model_version_tag = original
        return original(self, *args, **kwargs)
    MlflowClient.set_model_version_tag = paused
    params = load_params("params.yaml")
    params = params.model_copy(update={"tracking": params.tracking.model_copy(update=settings["tracking"])})
    blessing = Blessing(gate=GateResult.decide("bless", []), outcome=BlessOutcome.FIRST_MODEL,
                        model_name=settings["name"], candidate_path="data/profile/model.onnx",
                        candidate_sha256=settings["sha"], candidate_metrics={"f1_macro": 0.5})
    for round in (1, 2):
        if round == 2:
            while not Path(folder, "round-2").exists():
                time.sleep(0.02)
            print("ROUND 2", flush=True)
        try:
            outcome = {"registered": register.run(params, blessing).model_dump()}
        except (register.StoreBusy, register.TrackingServerDown) as exc:
            outcome = {type(exc).__name__: str(exc)}
        print(f"RESULT {round} " + json.dumps(outcome), flush=True)
""")


def start_register_child(project, folder: Path, sha: str, name: str, tracking: dict, release: str, log: Path,
                         env: dict[str, str], sqlite_busy_ms: int | None = None,
                         retry_delays_s: tuple[float, ...] = ()) -> subprocess.Popen:
    """The child, registering `name` (the model file of `sha`) with the project's params but `tracking`; it goes on
    from the pause once `release` exists in `folder`. Returns once it has paused there."""
    settings = {"folder": str(folder), "sha": sha, "name": name, "tracking": tracking, "release": release,
                "sqlite_busy_ms": sqlite_busy_ms, "retry_delays_s": list(retry_delays_s)}
    with log.open("w") as handle:
        child = subprocess.Popen([str(BIN / "python"), "-c", REGISTER_TWICE, json.dumps(settings)], cwd=project.root,
                                 stdout=handle, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 300
    while not (folder / "at-tags").exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise AssertionError(log.read_text()[-3000:])
        time.sleep(0.05)
    return child


def wait_for(text: str, log: Path, child: subprocess.Popen, after: str = "") -> str:
    """The child's output once `text` appears in it (after the line `after`); fails if the child exits first."""
    deadline = time.monotonic() + 300
    while True:
        output = log.read_text()
        if text in (output.partition(after)[2] if after else output):
            return output
        assert child.poll() is None and time.monotonic() < deadline, output[-3000:]
        time.sleep(0.05)


def result(round: int, log: Path, child: subprocess.Popen) -> dict:
    """The child's outcome of `round`, once it has printed it."""
    output = wait_for(f"RESULT {round} ", log, child)
    line = next(x for x in output.splitlines() if x.startswith(f"RESULT {round} "))
    return json.loads(line[len(f"RESULT {round} "):])
