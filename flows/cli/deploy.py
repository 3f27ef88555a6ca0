"""`torchship deploy`: a process work pool and `prefect deploy --all` on the Prefect server at PREFECT_API_URL, and the
automation that marks a run whose machine died crashed."""
from __future__ import annotations

import os
import subprocess
import sys

from flows.cli.output import console, fail
from flows.cli.stack.servers import POOL  # prefect.yaml's process pool: the one the team stack's workers serve
from flows.environment import enter_project
from tasks.core.env import PREFECT_API_URL


def deploy() -> None:
    """Register torchship's deployments (prefect.yaml) on the configured Prefect server.

    Needs PREFECT_API_URL (e.g. after `prefect server start`, export PREFECT_API_URL=http://127.0.0.1:4200/api).
    Creates the `torchship-process` work pool if missing, runs `prefect deploy --all`, and prints how to start
    a worker. The pipeline then runs on its cron schedule, the monitor on its interval, and a drift event
    starts the retrain deployment."""
    root = enter_project()
    api = os.environ.get(PREFECT_API_URL)
    if not api:
        fail("PREFECT_API_URL is not set: start a server (`prefect server start`) or point at yours, e.g.\n"
             "  export PREFECT_API_URL=http://127.0.0.1:4200/api\nthen run `torchship deploy` again. "
             "(The embedded default, `make pipeline`, needs no server and no deployments.)")
    prefect = [sys.executable, "-m", "prefect"]
    pools = subprocess.run([*prefect, "work-pool", "inspect", POOL], capture_output=True, text=True, cwd=root)
    if pools.returncode != 0:
        created = subprocess.run([*prefect, "work-pool", "create", POOL, "--type", "process"], capture_output=True,
                                 text=True, cwd=root)
        if created.returncode != 0:
            fail(f"could not create work pool {POOL} on {api}:\n{created.stdout[-2000:]}{created.stderr[-2000:]}")
        console.print(f"created work pool [bold]{POOL}[/] (process)")
    result = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], capture_output=True, text=True, cwd=root)
    if result.returncode != 0:
        fail(f"prefect deploy --all failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    ensure_crash_watch(prefect, root)
    console.print(f"deployed to {api}: pipeline (cron), monitor (interval), retrain (on torchship.drift.detected), "
                  "canary (on demand)")
    console.print(f"Start a worker in this folder:\n  [bold]prefect worker start --pool {POOL}[/]\n"
                  "Run one now: prefect deployment run 'torchship-pipeline/pipeline'")


def ensure_crash_watch(prefect: list[str], root) -> None:
    """The automation that marks the flow run of a machine that died Crashed (tasks/workspace/crash_watch.py), created
    once per server."""
    import json

    from tasks.workspace.crash_watch import AUTOMATION, automation_spec, crashed_within_s

    found = subprocess.run([*prefect, "automation", "inspect", AUTOMATION], capture_output=True, text=True, cwd=root)
    if found.returncode != 0:
        created = subprocess.run([*prefect, "automation", "create", "--from-json", json.dumps(automation_spec())],
                                 capture_output=True, text=True, cwd=root)
        if created.returncode != 0:
            fail(f"could not create the automation {AUTOMATION}:\n{created.stdout[-2000:]}{created.stderr[-2000:]}")
    console.print(f"automation [bold]{AUTOMATION}[/]: a flow run whose machine died is marked Crashed within "
                  f"{crashed_within_s():.0f} s")
