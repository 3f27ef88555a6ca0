"""The `torchship` command line."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import version as package_version
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from flows.environment import configure_environment, find_project_root
from tasks.core.errors import TorchshipError

app = typer.Typer(help="torchship: a PyTorch tabular classifier from raw data to a canaried service. "
                       "Run commands from the project folder (the one holding params.yaml).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()
err = Console(stderr=True)
SET_HELP = "Override a param as section.key=value (repeatable); written into params.yaml so DVC sees it."


def enter_project() -> Path:
    root = find_project_root()
    os.chdir(root)
    configure_environment(root)
    return root


def fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def version_callback(show: bool) -> None:
    if show:
        console.print(f"torchship {package_version('torchship')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """torchship command line."""


@app.command()
def run(params: Path = typer.Option(None, "--params", help="A YAML file of params merged over params.yaml."),
        set_: list[str] = typer.Option([], "--set", help=SET_HELP)) -> None:
    """Run the whole pipeline: the DVC stages (skipped when unchanged), then bless, register and canary.

    Exits 0 when the pipeline ran correctly, blessed or not (the summary says which and why);
    non-zero on errors, with params.yaml put back as it was."""
    from tasks.ops import overrides
    from tasks.prepare import write_source_fingerprint

    enter_project()
    touched = [Path("params.yaml"), Path("data/source.json")]
    saved = {path: path.read_bytes() if path.exists() else None for path in touched}
    try:
        raw, parsed = overrides.resolve(set_, str(params) if params else None)
        overrides.write_params(raw)
        write_source_fingerprint(parsed.data)
        from flows.pipeline import pipeline

        quiet_expected_tracebacks()
        started = time.perf_counter()
        summary = pipeline(params_file="params.yaml")
    except BaseException as exc:  # any failure, Ctrl-C included, puts params.yaml back
        for path, content in saved.items():
            if content is not None:
                path.write_bytes(content)
        if not isinstance(exc, TorchshipError):
            raise
        fail(f"{exc}\nNothing was registered or promoted; params.yaml is as it was before this run.")
    render_summary(summary, time.perf_counter() - started)


class _NoTracebackForUserErrors:
    """Prefect logs every failed task with its traceback; for errors we explain ourselves, the
    message is enough (a real bug keeps its traceback)."""

    def filter(self, record) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], TorchshipError):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_expected_tracebacks() -> None:
    import logging

    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_NoTracebackForUserErrors())


def render_summary(summary, seconds: float) -> None:
    table = Table(title=f"torchship pipeline · {summary.model_name} · {seconds:.0f}s")
    for column in ("step", "status", "time", "headline"):
        table.add_column(column, overflow="fold")
    colours = {"ran": "green", "pass": "green", "skipped": "dim", "fail": "red", "warn": "yellow"}
    for step in summary.steps:
        table.add_row(step.step, f"[{colours.get(step.status, 'cyan')}]{step.status}[/]", f"{step.seconds:.1f}s",
                      step.headline)
    console.print(table)
    aliases = ", ".join(f"{k} → v{v}" for k, v in sorted(summary.aliases.items())) or "none"
    console.print(f"[bold]model[/] {summary.model_name} v{summary.version} · aliases: {aliases}")
    console.print(f"[bold]verdict[/] {summary.verdict}")
    for name, path in summary.reports.items():
        console.print(f"  {name}: {path}")
    console.print("Open the MLflow and Prefect UIs: [bold]torchship ui[/]")


@app.command()
def plan(params: Path = typer.Option(None, "--params", help="A YAML file of params merged over params.yaml."),
         set_: list[str] = typer.Option([], "--set", help=SET_HELP)) -> None:
    """Show which DVC stages would re-run, and why, with these overrides (nothing runs, nothing changes)."""
    from tasks.ops import overrides
    from tasks.ops.reproduce import DVC_STAGES, stage_changes
    from tasks.prepare import write_source_fingerprint

    enter_project()
    try:
        raw, parsed = overrides.resolve(set_, str(params) if params else None)
        with overrides.temporarily_applied(raw, [Path("params.yaml"), Path("data/source.json")]):
            write_source_fingerprint(parsed.data)
            changes = stage_changes()
    except TorchshipError as exc:
        fail(str(exc))
    table = Table(title="torchship plan (from dvc status)")
    table.add_column("stage")
    table.add_column("would")
    table.add_column("why", overflow="fold")
    upstream_runs = False
    for stage in DVC_STAGES:
        reasons = changes.get(stage)
        if reasons:
            table.add_row(stage, "[yellow]run[/]", "; ".join(reasons))
            upstream_runs = True
        elif upstream_runs:
            table.add_row(stage, "[yellow]maybe run[/]", "if an upstream stage's outputs change")
        else:
            table.add_row(stage, "[dim]skip[/]", "deps, params and outs unchanged")
    for step in ("bless", "register", "canary"):
        table.add_row(step, "run", "compares with the live registry every run")
    console.print(table)


@app.command()
def ui(mlflow_port: int = typer.Option(5000, help="Port of the MLflow UI."),
       prefect_port: int = typer.Option(4200, help="Port of the Prefect UI."),
       check: bool = typer.Option(False, help="Start both, wait until they answer, print addresses, stop.")) -> None:
    """Start the MLflow UI (runs, registry, passports) and the Prefect UI (flow runs) on 127.0.0.1."""
    import httpx

    from tasks.config import load_params

    root = enter_project()
    params = load_params()
    bin_dir = Path(sys.executable).parent
    servers = {
        f"MLflow  http://127.0.0.1:{mlflow_port}": ([str(bin_dir / "mlflow"), "server", "--backend-store-uri",
                                                    params.tracking.resolved_uri(), "--host", "127.0.0.1",
                                                    "--port", str(mlflow_port), "--workers", "1"],
                                                   f"http://127.0.0.1:{mlflow_port}/health"),
        f"Prefect http://127.0.0.1:{prefect_port}": ([str(bin_dir / "prefect"), "server", "start", "--host",
                                                     "127.0.0.1", "--port", str(prefect_port)],
                                                    f"http://127.0.0.1:{prefect_port}/api/health"),
    }
    logs = root / ".prefect" / "ui-logs"
    logs.mkdir(parents=True, exist_ok=True)
    processes = {name: subprocess.Popen(command, stdout=(logs / f"{name.split()[0].lower()}.log").open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
                 for name, (command, _) in servers.items()}
    try:
        deadline = time.monotonic() + 120
        pending = dict(servers)
        while pending and time.monotonic() < deadline:
            for name, (_, health) in list(pending.items()):
                if processes[name].poll() is not None:
                    fail(f"{name.split()[0]} UI exited at start-up; see {logs}/")
                try:
                    if httpx.get(health, timeout=1).status_code == 200:
                        console.print(f"[green]ready[/] {name}")
                        del pending[name]
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        if pending:
            fail(f"not ready after 120s: {', '.join(pending)}; see {logs}/")
        if not check:
            console.print("Press Ctrl-C to stop both.")
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


@app.command()
def serve(host: str = typer.Option(None, help="Bind address (default from params: 127.0.0.1)."),
          port: int = typer.Option(None, help="Port (default from params)."),
          challenger_share: float = typer.Option(None, help="Share of traffic for the challenger alias.")) -> None:
    """Serve the registered champion (and a challenger share) over HTTP: /predict, /health, /metrics.

    The service follows alias moves in the registry (e.g. a promotion in the MLflow UI) within
    serve.poll_seconds, without dropping requests. Admin endpoints need TORCHSHIP_ADMIN_TOKEN."""
    enter_project()
    argv = []
    for flag, value in (("--host", host), ("--port", port), ("--challenger-share", challenger_share)):
        if value is not None:
            argv += [flag, str(value)]
    from serving.__main__ import main as serve_main

    serve_main(argv)


@app.command()
def status() -> None:
    """Registry state of this project's model: versions, aliases, bless/canary verdicts."""
    from tasks.config import load_params
    from tasks.core.registry import aliases, registry_client

    enter_project()
    try:
        params = load_params()
    except TorchshipError as exc:
        fail(str(exc))
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    current = aliases(client, name)
    versions = sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version))[:10]
    if not versions:
        console.print(f"No registered versions of '{name}' yet: run [bold]torchship run[/].")
        return
    table = Table(title=f"{name}: aliases {', '.join(f'{k} → v{v}' for k, v in current.items()) or 'none'}")
    for column in ("version", "aliases", "bless", "notes", "git"):
        table.add_column(column, overflow="fold")
    for v in versions:
        held = ", ".join(a for a, n in current.items() if n == str(v.version))
        notes = "; ".join(f"{k}: {v.tags[k]}" for k in ("rejected", "previous", "promoted") if k in v.tags)
        table.add_row(f"v{v.version}", held, v.tags.get("bless", ""), notes, v.tags.get("git_commit", "")[:10])
    console.print(table)


@app.command()
def rollback() -> None:
    """Put the version tagged `previous` back as champion (the current one is tagged rejected)."""
    from tasks.config import load_params
    from tasks.core.registry import registry_client
    from tasks.ops.registry import rollback as registry_rollback

    enter_project()
    params = load_params()
    try:
        restored, replaced = registry_rollback(registry_client(params.tracking), params.data.registered_model_name())
    except LookupError as exc:
        fail(str(exc))
    console.print(f"champion is v{restored} again (v{replaced} tagged rejected); running services follow within "
                  f"{params.serve.poll_seconds:g}s.")


@app.command()
def clean(yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
          cache: bool = typer.Option(False, help="Also empty the DVC cache (.dvc/cache).")) -> None:
    """Remove local state: stage outputs under data/, the MLflow store, Prefect's database."""
    root = enter_project()
    # Stage folders keep their .gitignore (written by DVC, committed with the project).
    targets = [p for name in ("prepare", "validate", "train", "export", "compress", "profile")
               for p in (root / "data" / name).glob("*") if p.name != ".gitignore"]
    targets += [root / "data" / name for name in ("quarantine", "serve", "batches")]
    targets += [p for p in (root / "mlflow").glob("*") if p.name != ".gitkeep"] + [root / ".prefect"]
    if cache:
        targets.append(root / ".dvc" / "cache")
    existing = [t for t in targets if t.exists()]
    if not existing:
        console.print("Nothing to clean.")
        return
    console.print("Will remove:\n" + "\n".join(f"  {t.relative_to(root)}" for t in existing))
    if not yes and not typer.confirm("Remove these (registered models and run history are lost)?"):
        raise typer.Exit(1)
    for target in existing:
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    console.print("Clean.")


@app.command()
def ingest(batch: Path = typer.Argument(..., help="A labelled CSV/Parquet batch (production rows with outcomes).")) -> None:
    """Judge a new labelled batch by the committed contract before it joins the training set.

    Accepted: stored in data/batches/ and used by the next `torchship run` (prepare re-runs). Refused: the
    file is moved to data/quarantine/<time>-<name>/ with its report; the training set is unchanged."""
    from tasks.config import load_params
    from tasks.ingest import ingest_batch

    enter_project()
    try:
        params = load_params()
        if not batch.exists():
            fail(f"{batch} not found.")
        gate, where = ingest_batch(batch, params)
    except TorchshipError as exc:
        fail(str(exc))
    if gate.blocks(params.validate_.warn_blocks):
        fail(f"batch refused: {gate.summary()}\nThe file and its report are in {where}/; the training set is unchanged.")
    console.print(f"[green]batch accepted[/] ({gate.summary()}): {where}. The next `torchship run` retrains on it.")


contract_app = typer.Typer(help="The data contract: propose one from reference data.", no_args_is_help=True)
app.add_typer(contract_app, name="contract")


@contract_app.command("suggest")
def contract_suggest(data: str = typer.Argument(..., help="A CSV/Parquet path, `synthetic` or `sklearn:<name>`."),
                     target: str = typer.Option(None, help="The label column (default: data.target or the "
                                                            "built-in source's)."),
                     margin: float = typer.Option(0.1, help="Widen observed numeric ranges by this share."),
                     ) -> None:
    """Profile DATA and print a proposed `contract:` section (YAML) for a human to review and commit.

    Use it with: torchship run --params contract.yaml (the section is merged into params.yaml)."""
    import io

    from ruamel.yaml import YAML

    from tasks.config import DataParams, load_params
    from tasks.contract import parse_table
    from tasks.core.contract_spec import suggest_contract
    from tasks.core.sources import resolve_target
    from tasks.prepare import load_source

    enter_project()
    try:
        current = load_params().data
        source = DataParams(**{**current.model_dump(), "source": data, "target": target or current.target})
        label = resolve_target(source)
        raw, origin = load_source(source, with_batches=False)
        typed, kinds = parse_table(raw, label, origin)
        proposal = suggest_contract(typed, kinds, label, margin=margin)
    except TorchshipError as exc:
        fail(str(exc))
    buffer = io.StringIO()
    yaml = YAML()
    yaml.width = 120
    yaml.dump({"contract": proposal.model_dump(exclude_none=True)}, buffer)
    typer.echo(f"# Proposed from {origin} ({len(typed)} rows) by `torchship contract suggest`: review every rule.\n"
               + buffer.getvalue())


@app.command("config-docs", hidden=True)
def config_docs() -> None:
    """Regenerate docs/configuration.md from the typed configuration."""
    from tasks.config import configuration_markdown

    root = enter_project()
    (root / "docs").mkdir(exist_ok=True)
    (root / "docs" / "configuration.md").write_text(configuration_markdown())
    console.print("wrote docs/configuration.md")


if __name__ == "__main__":
    app()
