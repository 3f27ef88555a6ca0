"""A Prefect global concurrency limit of one slot, held as a lock by processes on any machine that reaches the same
Prefect API: created if missing, taken with a bounded wait, its lease kept renewed while held, given back on every
exit path. Read in Prefect 3.9.1 (prefect/concurrency/_leases.py, prefect/server/services/repossessor.py):

- A slot is taken with a lease of LEASE_S (the server refuses less than 60 s). A thread of the holder renews it at
  once and then every 0.75 * LEASE_S (45 s), so a live holder keeps it however slow its work (an MLflow server
  restarting under a register). If renewing fails three times (each after Prefect's client has retried a lost
  connection for about a minute), the holder's work is cancelled: an exception is raised in it.
  The gap: a holder cut off from a Prefect server that the others still reach, inside a block that lasts past its
  lease, may overlap the next holder until it is cancelled. An alias move lasts seconds; Prefect unreachable for
  everyone lets nobody in.
- A holder that dies (SIGKILL, the machine gone) stops renewing: its lease expires at most LEASE_S after its last
  renewal, and the server's repossessor, which looks every PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS
  (default 15 s), gives the slot back. A waiter asks again every ~POLL_S. So a dead holder's slot is free within
  `dead_holder_bound_s(loop_s)` of its death: 60 + 15 + 0.5 s with the defaults.
- There is no slot decay (a decaying slot would run out under a slow, live holder)."""
from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator

log = logging.getLogger("torchship.limits")
LEASE_S = 60                # Prefect's minimum lease: the shortest time a dead holder can keep a slot
POLL_S = 0.25               # between two tries while the slot is taken (each try is one small request)
REPOSSESSOR_LOOP_S = 15.0   # Prefect's default for how often the server looks for expired leases
HTTP_LOCKED = 423           # what the server answers while the limit has no free slot


def dead_holder_bound_s(repossessor_loop_s: float = REPOSSESSOR_LOOP_S) -> float:
    """The longest a waiter waits for the slot of a holder that died right after renewing its lease."""
    return LEASE_S + repossessor_loop_s + 2 * POLL_S


def prefect_api_url() -> str | None:
    """The Prefect server this process talks to (PREFECT_API_URL, or the active profile's), None when Prefect would
    run an ephemeral API of its own."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


def ensure_limit(name: str) -> None:
    """Create the limit (one slot) unless it exists. Read first: a create that collides is a database integrity
    error the server logs with its whole traceback, which the embedded API prints on the user's console."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):   # another process created it since
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


class LimitInactive(RuntimeError):
    """The server granted no slot because the limit is missing or disabled: holding it would lock nothing."""


def take_slot(name: str, wait_s: float):
    """The lease on the limit's slot, asking every ~POLL_S until `wait_s` has passed; None if it stayed taken.
    Our own polling on Prefect's client, not `prefect.concurrency`'s: the server's Retry-After grows with the
    limit's average occupancy (up to 30 s), which after a dead holder would keep a waiter asleep long after the
    slot is free, and that module logs every refusal as an error with its traceback."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.responses import ConcurrencyLimitWithLeaseResponse
    from prefect.exceptions import PrefectHTTPStatusError

    deadline = time.monotonic() + wait_s
    with get_client(sync_client=True) as client:
        while True:
            try:
                granted = ConcurrencyLimitWithLeaseResponse.model_validate(
                    client.increment_concurrency_slots_with_lease([name], 1, "concurrency", LEASE_S).json())
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code != HTTP_LOCKED:
                    raise
            else:
                if not granted.limits:
                    raise LimitInactive(f"concurrency limit {name} is missing or disabled on the Prefect server "
                                        f"(`prefect gcl enable {name}`)")
                return granted.lease_id
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(left, POLL_S * random.uniform(0.5, 1.5)))   # jitter: waiters do not ask in step


def give_back(name: str, lease) -> None:
    """Release the slot; if the server cannot be told now, the lease expires by itself within LEASE_S."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
    except Exception as exc:   # never hide the block's own error behind this one
        log.warning("could not give back concurrency limit %s (%s): it frees when its lease expires, within %g s",
                    name, exc, LEASE_S)


@contextlib.contextmanager
def held_slot(name: str, wait_s: float) -> Iterator[None]:
    """Hold the one slot of limit `name` (created if missing) while inside; TimeoutError on entry when it stayed
    taken for `wait_s`. Prefect's own errors (no server, refused auth) are raised as they come."""
    from prefect.concurrency._leases import maintain_concurrency_lease

    ensure_limit(name)
    lease = take_slot(name, wait_s)
    if lease is None:
        raise TimeoutError(f"concurrency limit {name} stayed taken for {wait_s:g} s")
    try:
        with maintain_concurrency_lease(lease, LEASE_S, raise_on_lease_renewal_failure=True):
            yield
    finally:
        give_back(name, lease)
