"""The registry lock: held while reading aliases and moving them (and while writing the alias history), so a
check-then-move is one step for every process sharing the registry; MLflow has no compare-and-set.

Which lock follows from where the registry is (`lock_kind`):
- a SQLite file (the embedded default): a file lock beside the database, which every process of this machine sees;
- a tracking server or a database (the team topology, workers on several machines): a Prefect global concurrency
  limit per registered model (`torchship-registry-<model>`, one slot) on the Prefect server at PREFECT_API_URL, which
  every machine reaches (tasks/core/prefect_limits.py: leases, and the bound on a dead holder). Without such a
  server, alias moves are refused: an ephemeral Prefect API is the process's own and would exclude nobody;
- MLflow's local file store (`./mlruns`, deprecated for the registry): one machine's, unlocked as it always was.
Only alias moves are serialised: training, and everything else a pipeline run does, is not."""
from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tasks.core.errors import TorchshipError
from tasks.core.prefect_limits import dead_holder_bound_s, held_slot, prefect_api_url

LOCK_WAIT_S = 60.0          # the file lock: its holder is on this machine, and frees it the moment it dies
SERVER_LOCK_WAIT_S = 120.0  # the server lock: longer than a dead holder can keep it (LEASE_S + the repossessor)
LIMIT_PREFIX = "torchship-registry-"
FILE, SERVER, UNLOCKED = "file", "server", "unlocked"


class RegistryLockError(TorchshipError):
    """The registry lock could not be taken: nothing was moved."""


def lock_kind(tracking_uri: str) -> str:
    """FILE for a SQLite registry, UNLOCKED for MLflow's local file store, SERVER for anything other machines reach
    (http(s), databricks, a database URI)."""
    if tracking_uri.startswith("sqlite:///"):
        return FILE
    scheme = urlsplit(tracking_uri).scheme
    return UNLOCKED if scheme in ("", "file") or len(scheme) == 1 else SERVER   # len 1: a Windows drive letter


def limit_name(model: str) -> str:
    """`torchship-registry-<model>`; characters a limit name may not hold become '-', with a hash of the name
    then added so that two models never share a limit."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", model)
    suffix = "" if safe == model else "-" + hashlib.sha1(model.encode()).hexdigest()[:8]
    return f"{LIMIT_PREFIX}{safe}{suffix}"


def shown(uri: str) -> str:
    """A URI as an error may show it: scheme, host and port, never a user or password."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


def no_server_message(model: str, tracking_uri: str) -> str:
    return (f"alias moves of {model} are refused: the registry is {shown(tracking_uri)}, shared by every machine, so "
            f"each move is serialised by the Prefect global concurrency limit '{limit_name(model)}' on a Prefect "
            "server every machine reaches, and none is configured (PREFECT_API_URL is not set; an ephemeral Prefect "
            "API belongs to this process alone and would lock nothing). Set PREFECT_API_URL to the team's server "
            "(and PREFECT_API_AUTH_STRING when it has auth on), e.g. `eval \"$(torchship stack env)\"` for the local "
            "stack, and run the command again. Nothing was moved.")


def busy_message(model: str, api_url: str, wait_s: float) -> str:
    limit = limit_name(model)
    return (f"the registry lock of {model} (Prefect concurrency limit '{limit}' on {shown(api_url)}) stayed taken for "
            f"{wait_s:g} s: another process is moving {model}'s aliases. Nothing was moved; run the command again. A "
            f"holder that died frees it by itself within about {dead_holder_bound_s():.0f} s (its lease runs out); "
            f"if it is still taken longer after that, with no torchship command running on {model}, free it with "
            f"`prefect gcl update {limit} --active-slots 0`.")


@contextlib.contextmanager
def server_lock(model: str, tracking_uri: str, wait_s: float) -> Iterator[None]:
    """The Prefect limit of `model`, or a RegistryLockError that says why not and what to do."""
    api_url = prefect_api_url()
    if not api_url:
        raise RegistryLockError(no_server_message(model, tracking_uri))
    with contextlib.ExitStack() as stack:   # entering apart from the body: only the lock's own errors are ours
        try:
            stack.enter_context(held_slot(limit_name(model), wait_s))
        except TimeoutError:
            raise RegistryLockError(busy_message(model, api_url, wait_s)) from None
        except Exception as exc:   # unreachable, auth refused: Prefect's own words, then ours
            raise RegistryLockError(
                f"the registry lock of {model} could not be taken on the Prefect server {shown(api_url)}: "
                f"{type(exc).__name__}: {exc}. Check that the server answers and that PREFECT_API_AUTH_STRING is "
                "right. Nothing was moved.") from exc
        yield


@contextlib.contextmanager
def alias_lock(client, model: str, timeout: float | None = None) -> Iterator[None]:
    """Hold while reading `model`'s aliases and moving them (and while writing its history): the lock that fits
    where the client's registry is (see the module's docstring). `timeout`: the wait, else that lock's default."""
    uri = client.tracking_uri
    kind = lock_kind(uri)
    if kind == SERVER:
        with server_lock(model, uri, SERVER_LOCK_WAIT_S if timeout is None else timeout):
            yield
        return
    if kind == UNLOCKED:
        yield
        return
    from filelock import FileLock

    lock_file = Path(uri[len("sqlite:///"):]).with_suffix(".aliases.lock")
    with FileLock(str(lock_file), timeout=LOCK_WAIT_S if timeout is None else timeout):
        yield
