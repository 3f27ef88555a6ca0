"""One writer per workspace: the pipeline, a retrain and a canary each hold the workspace's Prefect global
concurrency limit (limit 1) while they run, so a scheduled run, a drift-triggered retrain and a canary never
write the same data/, dvc.lock and registry aliases at once. The limit lives in the Prefect database (the
project's SQLite file in the embedded default, the server's when scaled out), so separate processes see it.

A holder renews its lease while it runs; one killed by SIGKILL stops renewing and its lease expires after
LEASE_S. A Prefect server's repossessor then gives the slot back. The embedded default has no server
running that service, so its leases are kept on disk (flows/environment.py) and the next run that finds the
slot taken gives back the expired ones itself before it waits.

A holder also writes `.prefect/workspace-holder.json` (host, PID, the process's start time, its lease): a run that
finds the slot taken by a process of this machine that no longer exists (killed outright: SIGKILL, OOM) gives its
lease back at once, instead of making the restart wait out the lease (tests/reliability/test_kill_ladder.py).
Before it does, it stops what the dead holder started and left running: `dvc repro` and its stage, a service,
each in a session of its own, so killing the holder's PID alone does not reach them. They carry the lease in
their environment (WORKSPACE_LEASE_ENV), which is how they are found (tests/reliability/test_signals.py)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from tasks.core.env import FILE_LEASES, WORKSPACE_LEASE_ENV
from tasks.core.errors import TorchshipError
from tasks.core.prefect_limits import LEASE_S, ensure_limit

_holding: ContextVar[str | None] = ContextVar("torchship_workspace_lock", default=None)
HOLDER_FILE = Path(".prefect") / "workspace-holder.json"
log = logging.getLogger("torchship.workspace")


class WorkspaceBusy(TorchshipError):
    """Another pipeline run, retrain or canary holds this workspace."""


def workspace_limit_name(root: Path | None = None) -> str:
    """One limit per workspace folder: `torchship-workspace-<folder name>-<hash of its path>`."""
    root = (root or Path.cwd()).resolve()
    return f"torchship-workspace-{root.name[:24]}-{hashlib.sha1(str(root).encode()).hexdigest()[:8]}"


def release_expired_leases() -> int:
    """Embedded default only (leases on disk, no repossessor): give back the slots of expired leases."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    if get_current_settings().server.concurrency.lease_storage != FILE_LEASES:
        return 0
    from prefect.server.concurrency.lease_storage.filesystem import ConcurrencyLeaseStorage
    from prefect.utilities.asyncutils import run_coro_as_sync

    expired = run_coro_as_sync(ConcurrencyLeaseStorage().read_expired_lease_ids())
    with get_client(sync_client=True) as client:
        for lease_id in expired:
            client.release_concurrency_slots_with_lease(lease_id)
    return len(expired)


def process_started(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, from /proc), None when it does not exist: with
    the PID it names one process for good (a PID alone may be reused)."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None when the process does not exist."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@contextlib.contextmanager
def acquire(name: str, wait_s: float) -> Iterator[None]:
    """Take the slot (TimeoutError after `wait_s`), keep its lease renewed while inside, record who holds it."""
    from prefect.concurrency._leases import maintain_concurrency_lease
    from prefect.concurrency._sync import acquire_concurrency_slots_with_lease, release_concurrency_slots_with_lease

    lease = acquire_concurrency_slots_with_lease([name], 1, timeout_seconds=wait_s, strict=True,
                                                 lease_duration=LEASE_S).lease_id
    try:
        HOLDER_FILE.parent.mkdir(parents=True, exist_ok=True)
        HOLDER_FILE.write_text(json.dumps({"slot": name, "host": socket.gethostname(), "pid": os.getpid(),
                                           "started": process_started(os.getpid()), "lease": str(lease)}))
        os.environ[WORKSPACE_LEASE_ENV] = str(lease)
        with maintain_concurrency_lease(lease, LEASE_S, raise_on_lease_renewal_failure=True):
            yield
    finally:
        os.environ.pop(WORKSPACE_LEASE_ENV, None)
        release_concurrency_slots_with_lease(lease)
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(HOLDER_FILE.read_text()).get("lease") == str(lease):
                HOLDER_FILE.unlink()


def release_dead_holder(name: str) -> bool:
    """Give back the slot of a holder on this machine whose process is gone (killed before it could release it).
    Under a file lock, so two restarts never both release (and the second free a live holder's slot)."""
    from filelock import FileLock
    from prefect.concurrency._sync import release_concurrency_slots_with_lease

    with FileLock(str(HOLDER_FILE.with_suffix(".lock")), timeout=30):
        try:
            holder = json.loads(HOLDER_FILE.read_text())
        except (FileNotFoundError, ValueError):
            return False
        if (holder.get("slot") != name or holder.get("host") != socket.gethostname()
                or process_started(int(holder["pid"])) == holder.get("started")):
            return False   # another workspace's, another machine's, or alive
        if left := stop_left_behind(holder["lease"]):
            log.warning("stopped %d process(es) a killed run had left working in this workspace (PIDs %s)",
                        len(left), ", ".join(map(str, left)))
        release_concurrency_slots_with_lease(holder["lease"])
        HOLDER_FILE.unlink(missing_ok=True)
        return True


def stop_left_behind(lease: str, wait_s: float = 10.0) -> list[int]:
    """SIGKILL every process of this machine that carries `lease` in its environment (a dead holder's children and
    theirs), as a supervisor would have killed the holder's whole tree; wait (bounded) until they are gone."""
    marker = f"{WORKSPACE_LEASE_ENV}={lease}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except OSError:   # gone meanwhile, or another user's
            continue
    deadline = time.monotonic() + wait_s
    while any((fields := proc_stat(pid)) and fields[0] != "Z" for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)   # until each is gone or a zombie (killed: it runs no more code)
    return killed


@contextlib.contextmanager
def workspace_lock(holder: str, wait_s: float) -> Iterator[None]:
    """Hold the workspace for `holder` (re-entrant: the pipeline a retrain runs is inside the retrain's hold);
    raise WorkspaceBusy when it stays taken for `wait_s`."""
    if _holding.get() is not None:
        yield
        return
    name = workspace_limit_name()
    ensure_limit(name)
    release_dead_holder(name)   # before the first try: a killed run's slot is free at once, without a timeout logged
    with contextlib.ExitStack() as stack:
        try:
            try:
                stack.enter_context(acquire(name, min(wait_s, 1.0)))
            except TimeoutError:
                if not (release_dead_holder(name) or release_expired_leases()) and wait_s <= 1.0:
                    raise
                stack.enter_context(acquire(name, wait_s))
        except TimeoutError:
            raise WorkspaceBusy(
                f"the workspace is busy: another pipeline run, retrain or canary holds it (Prefect concurrency "
                f"limit '{name}'); {holder} did not start. Try again when it finishes (a run killed outright on this "
                f"machine frees it at once; on another, about {LEASE_S}s later, when its lease expires; by hand: "
                f"prefect gcl update {name} --active-slots 0)") from None
        token = _holding.set(holder)
        try:
            yield
        finally:
            _holding.reset(token)
