"""One writer per workspace: the pipeline, a retrain and a canary each hold the workspace's Prefect global
concurrency limit (limit 1) while they run, so a scheduled run, a drift-triggered retrain and a canary never
write the same data/, dvc.lock and registry aliases at once. The limit lives in the Prefect database (the
project's SQLite file in the embedded default, the server's when scaled out), so separate processes see it."""
from __future__ import annotations

import contextlib
import hashlib
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from tasks.core.errors import TorchshipError

_holding: ContextVar[str | None] = ContextVar("torchship_workspace_slot", default=None)


class WorkspaceBusy(TorchshipError):
    """Another pipeline run, retrain or canary holds this workspace."""


def slot_name(root: Path | None = None) -> str:
    """One limit per workspace folder: `torchship-workspace-<folder name>-<hash of its path>`."""
    root = (root or Path.cwd()).resolve()
    return f"torchship-workspace-{root.name[:24]}-{hashlib.sha1(str(root).encode()).hexdigest()[:8]}"


def ensure_limit(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass


@contextlib.contextmanager
def workspace_slot(holder: str, wait_s: float) -> Iterator[None]:
    """Hold the workspace for `holder` (re-entrant: the pipeline a retrain runs is inside the retrain's hold);
    raise WorkspaceBusy when it stays taken for `wait_s`."""
    if _holding.get() is not None:
        yield
        return
    from prefect.concurrency.sync import concurrency

    name = slot_name()
    ensure_limit(name)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(concurrency(name, occupy=1, timeout_seconds=wait_s, strict=True))
        except TimeoutError:
            raise WorkspaceBusy(
                f"the workspace is busy: another pipeline run, retrain or canary holds it (Prefect concurrency "
                f"limit '{name}'); {holder} did not start. Try again when it finishes. If nothing is running "
                f"(a killed run can leave the slot taken): prefect gcl update {name} --active-slots 0") from None
        token = _holding.set(holder)
        try:
            yield
        finally:
            _holding.reset(token)
