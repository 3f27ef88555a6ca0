"""The registry lock on the team topology (tasks/registry/lock.py): a real `prefect server` (the session's) and a
real `mlflow server` (on SQLite) on 127.0.0.1, and real processes. Two processes moving `champion` at once never
overlap inside the lock and lose no update; a holder SIGKILLed inside the lock frees it within the stated bound; a
live holder keeps it past its lease (renewed); without a Prefect server, alias moves are refused and nothing moves.

A dead holder's slot frees only once its lease runs out (60 s, Prefect's minimum): the killed and the slow holder
start with the module and are checked by its last test, so that minute passes while the other tests run."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tasks.core.gate import GateResult
from tasks.core.prefect_limits import LEASE_S, REPOSSESSOR_LOOP_S, dead_holder_bound_s, take_slot
from tasks.core.procs import Child, free_port, http_ok, start_child, wait_until_ready
from tasks.core.verdicts import Blessing, BlessOutcome
from tasks.register import apply_aliases
from tasks.registry.lock import RegistryLockError, alias_lock, limit_name
from tasks.registry.read import CHAMPION, aliases
from tests.conftest import BIN, REPO

pytestmark = pytest.mark.integration
LATE_S = 10              # what a busy 2-core box may add to the bound (a revoke task, a delayed poll)
START_S = 120            # a Python process importing MLflow and Prefect, beside others, on 2 busy cores
MODEL, KILLED, SLOW, REFUSED = "lock-race", "lock-killed", "lock-slow", "lock-refused"
MOVES = 4                # per mover
NO_ARTIFACT = "s3://nowhere/no-artifact"   # a version needs a source; a server refuses a local path without a run

HOLDER = textwrap.dedent("""
    import sys, time
    from mlflow import MlflowClient
    from tasks.registry.lock import alias_lock
    uri, model, hold_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with alias_lock(MlflowClient(uri, uri), model, timeout=30):
        print("inside", time.time(), flush=True)
        time.sleep(hold_s)
        print("leaving", time.time(), flush=True)
""")
WAITER = textwrap.dedent("""
    import sys, time
    from mlflow import MlflowClient
    from tasks.registry.lock import alias_lock
    uri, model, wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    print("waiting", time.time(), flush=True)
    with alias_lock(MlflowClient(uri, uri), model, timeout=wait_s):
        print("acquired", time.time(), flush=True)
""")
MOVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mlflow import MlflowClient
    from tasks.registry.read import CHAMPION, aliases
    from tasks.registry.write import promote, recorded_move
    uri, model, who, moves, trace, go = sys.argv[1:]
    client = MlflowClient(uri, uri)
    client.get_registered_model(model)                     # warm: both movers start from the same line
    print("ready", time.time(), flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    for i in range(int(moves)):
        with recorded_move(client, model, f"mover {who}", f"move {i} by {who}"):
            with open(trace, "a") as out:
                out.write(f"enter {who}\\n")
            target = "2" if aliases(client, model).get(CHAMPION) == "1" else "1"
            time.sleep(0.05)                               # check, then move: the window a lost update needs
            promote(client, model, target, f"move {i} by {who}")
            with open(trace, "a") as out:
                out.write(f"leave {who}\\n")
    print("done", time.time(), flush=True)
""")


@dataclass
class Servers:
    mlflow_uri: str
    prefect_api: str
    folder: Path
    children: list[Child]

    def env(self) -> dict[str, str]:
        """A worker's environment: the team's Prefect server, no other Prefect or MLflow setting."""
        kept = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
        return {**kept, "PREFECT_API_URL": self.prefect_api, "PREFECT_HOME": str(self.folder / "client-home"),
                "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "PYTHONUNBUFFERED": "1"}

    def start(self, name: str, script: str, *args: str) -> Child:
        child = start_child(name, [sys.executable, "-c", script, *args], self.folder / f"{name}.log",
                            env=self.env(), cwd=REPO)
        self.children.append(child)
        return child

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.mlflow_uri, registry_uri=self.mlflow_uri)


def said(child: Child, word: str, timeout: float = START_S) -> float:
    """The time on the line `child` printed starting with `word` (waiting for it, bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in child.log.read_text(errors="replace").splitlines():
            if line.startswith(word + " "):
                return float(line.split()[1])
        assert child.process.poll() is None, f"{child.name} exited without '{word}':\n{child.output_tail()}"
        assert time.monotonic() < deadline, f"{child.name} did not say '{word}' in {timeout:g} s:\n" \
                                            f"{child.output_tail()}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, prefect_server):
    """The session's Prefect server (tests/conftest.py: the lock's limits are named by model, none of them another
    module's) and an `mlflow server` of the module's own on SQLite."""
    folder = tmp_path_factory.mktemp("registry-lock")
    port = free_port()
    mlflow = start_child("mlflow server", [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                                           "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                                           "--default-artifact-root", str(folder / "artifacts")],
                         folder / "mlflow.log", env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                                                     "MLFLOW_DISABLE_TELEMETRY": "true"})
    found = Servers(f"http://127.0.0.1:{port}", "", folder, [mlflow])
    try:
        wait_until_ready(mlflow, http_ok(f"{found.mlflow_uri}/health"), START_S)
        found.prefect_api = prefect_server.api_url()
        yield found
    finally:   # stopped side by side: each may take seconds to shut down on a busy box
        for child in found.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGTERM)
        for child in found.children:
            child.stop()


@dataclass
class LongWaits:
    killed_holder: Child
    killed_at: float
    killed_waiter: Child
    slow_holder: Child
    slow_waiter: Child


@pytest.fixture(scope="module")
def long_waits(servers) -> LongWaits:
    """A holder SIGKILLed inside the lock and one that holds it past its lease, each with a waiter started behind
    it: started at once, checked by the module's last test."""
    killed = servers.start("killed-holder", HOLDER, servers.mlflow_uri, KILLED, "600")
    slow = servers.start("slow-holder", HOLDER, servers.mlflow_uri, SLOW, str(LEASE_S + 2 * REPOSSESSOR_LOOP_S + 2))
    said(killed, "inside")
    os.killpg(killed.process.pid, signal.SIGKILL)   # the machine "dies": no finally, no release
    killed_at = time.time()
    killed.process.wait(timeout=10)
    wait_s = str(dead_holder_bound_s(REPOSSESSOR_LOOP_S) + 60)
    killed_waiter = servers.start("killed-waiter", WAITER, servers.mlflow_uri, KILLED, wait_s)
    said(slow, "inside")
    slow_waiter = servers.start("slow-waiter", WAITER, servers.mlflow_uri, SLOW, wait_s)
    return LongWaits(killed, killed_at, killed_waiter, slow, slow_waiter)


def test_a_holder_killed_inside_the_lock_keeps_it_taken(servers, long_waits):
    """Its lease is still running: the slot is not free by itself (no connection drop frees it)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: servers.prefect_api}):
        assert take_slot(limit_name(KILLED), 0.5) is None


def test_two_processes_moving_at_once_never_overlap_and_lose_no_update(servers):
    client = servers.client()
    client.create_registered_model(MODEL)
    for _ in range(2):
        client.create_model_version(MODEL, source=NO_ARTIFACT)
    client.set_registered_model_alias(MODEL, CHAMPION, "1")
    trace, go = servers.folder / "trace.txt", servers.folder / "go"
    movers = [servers.start(f"mover-{who}", MOVER, servers.mlflow_uri, MODEL, who, str(MOVES), str(trace), str(go))
              for who in ("a", "b")]
    for mover in movers:
        said(mover, "ready")
    started = time.monotonic()
    go.touch()   # both are parked at the start line: release them together
    for mover in movers:
        said(mover, "done", timeout=180)
    print(f"{2 * MOVES} moves by two processes in {time.monotonic() - started:.1f} s")

    steps = trace.read_text().split("\n")[:-1]
    assert len(steps) == 4 * MOVES
    for enter, leave in zip(steps[::2], steps[1::2], strict=True):   # each holder leaves before another enters
        assert enter.split()[0] == "enter" and leave == enter.replace("enter", "leave"), steps
    from tasks.registry.history import read_history

    history = read_history(client, MODEL)
    assert [entry.seq for entry in history] == list(range(1, 2 * MOVES + 2))   # no entry overwritten by another
    assert history[0].kind == "start" and history[0].to_version == "1"         # set here, before any mover
    moves = history[1:]
    assert Counter(entry.actor for entry in moves) == {"mover a": MOVES, "mover b": MOVES}
    for before, entry in zip(history, moves):   # each move starts where the one before ended: none was lost
        assert (entry.kind, entry.from_version) == ("move", before.to_version)
        assert entry.to_version != entry.from_version
    assert aliases(client, MODEL) == {CHAMPION: moves[-1].to_version}


def test_the_lock_is_given_back_on_an_error_and_a_bounded_wait_says_what_to_do(servers):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    client = servers.client()
    with temporary_settings({PREFECT_API_URL: servers.prefect_api}):
        with pytest.raises(ValueError), alias_lock(client, "lock-errors"):
            raise ValueError("a move that failed")
        # free again at once; a second taker, meanwhile, waits its second and is told what to do
        with alias_lock(client, "lock-errors", timeout=1), pytest.raises(RegistryLockError) as busy, \
                alias_lock(client, "lock-errors", timeout=1):
            pass
    message = str(busy.value)
    assert "stayed taken for 1 s" in message and limit_name("lock-errors") in message
    assert f"prefect gcl update {limit_name('lock-errors')} --active-slots 0" in message


def test_without_a_prefect_server_a_server_registry_refuses_to_move(servers):
    """The register step on the tracking server with no PREFECT_API_URL (an ephemeral Prefect): refused, and the
    registry is as it was."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    client = servers.client()
    client.create_registered_model(REFUSED)
    client.create_model_version(REFUSED, source=NO_ARTIFACT)
    blessing = Blessing(gate=GateResult.decide("bless", []), outcome=BlessOutcome.BETTER, model_name=REFUSED,
                        candidate_path="model.onnx", candidate_sha256="0" * 64, candidate_metrics={"f1_macro": 0.9},
                        champion_version=None)
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(RegistryLockError) as refused:
        apply_aliases(client, REFUSED, "1", blessing)
    message = str(refused.value)
    assert "refused" in message and "PREFECT_API_URL" in message and "Nothing was moved" in message
    assert servers.mlflow_uri.split("//")[1] in message and limit_name(REFUSED) in message
    assert aliases(client, REFUSED) == {}
    assert not any(key.startswith("history.") for key in client.get_registered_model(REFUSED).tags)


def test_a_dead_holder_frees_the_lock_within_the_bound_and_a_live_one_keeps_it(long_waits):
    """Last in the module: the killed holder's lease has been running out meanwhile."""
    bound = dead_holder_bound_s(REPOSSESSOR_LOOP_S)
    taken_again = said(long_waits.killed_waiter, "acquired", timeout=bound + 60)
    freed_after = taken_again - long_waits.killed_at
    print(f"the killed holder's slot was taken again {freed_after:.1f} s after the kill (bound {bound:.1f} s)")
    assert freed_after <= bound + LATE_S
    # ... and not before its lease ran out (it started as the holder got in; a second of slack for the clocks)
    assert taken_again - said(long_waits.killed_holder, "inside") >= LEASE_S - 1
    left = said(long_waits.slow_holder, "leaving", timeout=bound)
    held = left - said(long_waits.slow_holder, "inside")
    assert held > LEASE_S + REPOSSESSOR_LOOP_S   # past its first lease: only the renewals kept it
    assert said(long_waits.slow_waiter, "acquired", timeout=60) >= left   # nobody got in while it was alive
