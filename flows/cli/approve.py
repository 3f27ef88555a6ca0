"""`torchship approve` and `torchship reject`: a person decides on a version awaiting approval
(promotion.approval: required)."""
from __future__ import annotations

import os

import typer

from flows.cli.output import console
from flows.environment import enter_project
from tasks.core.env import TOKEN_ENV


def approve(version: str = typer.Argument(..., help="The version awaiting approval."),
            reason: str = typer.Option(..., "--reason", help="Why: recorded in the alias history."),
            url: str = typer.Option(None, "--url", help="Run its canary on this running service's live traffic "
                                                        "(as `torchship canary --url`). Default: replayed rows."),
            token: str = typer.Option(None, "--token", envvar=TOKEN_ENV, show_envvar=True,
                                      help="The admin token the service at --url was started with."),
            request_log: str = typer.Option(None, "--request-log", help="The request log of the service at --url "
                                                                        "(default: serve.request_log).")) -> None:
    """Approve VERSION (registered awaiting approval, promotion.approval: required): it takes `challenger` and its
    canary starts now (as `torchship canary`, on the service at --url when given). The decision and the OS user
    go in the alias history. A version past promotion.approval_timeout_s is rejected instead."""
    enter_project()
    from flows.cli.canary import render
    from tasks.config import load_params
    from tasks.registry.approvals import decide_by_hand
    from tasks.registry.history import command_actor, os_user

    done = decide_by_hand(load_params(), version, "approved", reason, command_actor("approve"), os_user())
    console.print(done.action)
    if done.canary_due:
        from flows.canary import canary_flow

        if token:
            os.environ[TOKEN_ENV] = token
        with console.status("canary: shadow, then canary.steps; each step waits for canary.min_samples"):
            render(canary_flow(params_file="params.yaml", url=url, request_log=request_log))


def reject(version: str = typer.Argument(..., help="The version awaiting approval."),
           reason: str = typer.Option(..., "--reason", help="Why: recorded on the version and in the history.")
           ) -> None:
    """Reject VERSION (registered awaiting approval): tagged rejected, never canaried; `champion` is untouched.
    The decision and the OS user go in the alias history."""
    enter_project()
    from tasks.config import load_params
    from tasks.registry.approvals import decide_by_hand
    from tasks.registry.history import command_actor, os_user

    console.print(decide_by_hand(load_params(), version, "rejected", reason, command_actor("reject"), os_user()).action)
