"""`torchship promote`, `torchship rollback` and `torchship rebaseline`: the by-hand moves of `champion`, each
recorded in the alias history with its reason."""
from __future__ import annotations

import typer

from flows.cli.output import console
from flows.environment import enter_project


def promote(version: str = typer.Argument(..., help="The registered version to make champion."),
            reason: str = typer.Option(..., "--reason", help="Why: recorded on the version (tag `promoted`)."),
            force: bool = typer.Option(False, "--force", help="Promote a version bless did not pass (recorded as "
                                                              "tag `forced`).")) -> None:
    """Move `champion` to VERSION by hand; the old champion is tagged `previous` (so `torchship rollback`
    undoes it). A version that bless did not pass is refused unless --force. Running services follow the
    alias within serve.poll_seconds."""
    enter_project()
    from tasks.config import load_params
    from tasks.registry.moves import promote_version

    done = promote_version(load_params(), version, reason, force)
    was = f" (was v{done.replaced}, tagged previous)" if done.replaced and done.replaced != done.promoted else ""
    forced = " [yellow]forced[/]" if done.forced else ""
    console.print(f"champion of {done.model_name} is v{done.promoted}{was}{forced}; "
                  f"running services follow within {done.poll_seconds:g}s.")


def rollback() -> None:
    """Put back the version that was champion before the current one, by the alias history (with no history
    yet, the version tagged `previous`); the current one is tagged rejected.

    Running services follow the alias within serve.poll_seconds."""
    enter_project()
    from tasks.config import load_params
    from tasks.registry.moves import roll_back

    done = roll_back(load_params())
    console.print(f"champion of {done.model_name} is v{done.restored} again (v{done.replaced} tagged rejected); "
                  f"running services follow within {done.poll_seconds:g}s.")


def rebaseline(version: str = typer.Argument(..., help="The registered version to make the new baseline champion."),
               reason: str = typer.Option(..., "--reason", help="Why the old champion no longer compares: recorded "
                                                                "on the version and the registered model.")) -> None:
    """Make VERSION champion when bless could not compare it with the champion: its input columns or the
    bless metric changed, so "better than the champion" has no meaning. An explicit, audited decision (tags
    `rebaselined` on the version and `baseline` on the model; the old champion is tagged `previous`).
    A version refused for anything else (e.g. worse than the scikit-learn baselines) is refused here too."""
    enter_project()
    from tasks.config import load_params
    from tasks.registry.moves import rebaseline_version

    done = rebaseline_version(load_params(), version, reason)
    was = f" (v{done.replaced} tagged previous)" if done.replaced else ""
    console.print(f"champion of {done.model_name} is v{done.promoted}, re-baselined{was}; "
                  f"running services follow within {done.poll_seconds:g}s.")
