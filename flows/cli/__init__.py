"""The `torchship` command line: one module per command group. Each command parses its arguments, calls one
function in tasks/ (or the pipeline flow, or the service) and renders the result."""
from __future__ import annotations

from importlib.metadata import version as package_version

import typer
from typer.core import TyperGroup

from flows.cli import canary, data, loop, observability, pipeline, predict, registry, servers, stack, workspace
from flows.cli.output import console, fail
from tasks.core.errors import TorchshipError


class TorchshipGroup(TyperGroup):
    """Any command's TorchshipError becomes one red paragraph and its exit code (2); a bug keeps its traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TorchshipError as exc:
            fail(str(exc), exc.exit_code)


app = typer.Typer(cls=TorchshipGroup, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",
                  help="torchship: a PyTorch tabular classifier from raw data to a canaried service. "
                       "Run commands from the project folder (the one holding params.yaml).")


def show_version(show: bool) -> None:
    if show:
        console.print(f"torchship {package_version('torchship')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """torchship command line."""


for command in (pipeline.run, pipeline.plan, servers.ui, servers.serve, registry.status, registry.history,
                registry.promote, registry.rollback, registry.approve, registry.reject,
                registry.rebaseline, registry.rebuild,
                workspace.clean, data.ingest, loop.monitor, loop.deploy, predict.predict,
                observability.observability):
    app.command()(command)
app.command()(canary.canary)
app.add_typer(data.contract_app, name="contract")
app.add_typer(loop.demo_app, name="demo")
app.add_typer(stack.stack_app, name="stack")
app.command("config-docs", hidden=True)(workspace.config_docs)
app.command("dvc-deps", hidden=True)(workspace.dvc_deps)

__all__ = ["app"]
