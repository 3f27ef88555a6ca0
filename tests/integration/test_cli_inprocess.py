"""The CLI in this process (typer's CliRunner): every command explains itself, status and rollback on a real
MLflow SQLite registry of their own, clean in a throwaway clone, and errors as one red paragraph (exit 2)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from ruamel.yaml import YAML
from typer.main import get_command
from typer.testing import CliRunner

from flows.cli import app
from tests.conftest import REPO, make_project

pytestmark = pytest.mark.integration
MODEL = "synthetic-churn"  # the registered name params.yaml derives from its default source


@pytest.fixture
def cli(monkeypatch):
    """invoke(folder, *args): the CLI run from `folder`; the working directory and the environment variables
    the commands set (Prefect home, telemetry) are put back afterwards."""
    saved = dict(os.environ)
    runner = CliRunner()

    def invoke(folder, *args: str, input: str | None = None):
        monkeypatch.chdir(folder)
        return runner.invoke(app, list(args), input=input)

    yield invoke
    os.environ.clear()
    os.environ.update(saved)


def commands(group, prefix: tuple[str, ...] = ()):
    """Every command path of the CLI, sub-groups included (`contract suggest`)."""
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if hasattr(command, "commands"):  # a group
            yield from commands(command, (*prefix, name))


def test_every_command_explains_itself(cli, tmp_path):
    found = dict(commands(get_command(app)))
    assert {("run",), ("plan",), ("ui",), ("serve",), ("status",), ("rollback",), ("clean",), ("ingest",),
            ("contract", "suggest"), ("config-docs",)} <= set(found)
    for path, command in found.items():
        result = cli(tmp_path, *path, "--help")
        assert result.exit_code == 0 and "Usage" in result.stdout, path
        summary = (command.help or "").split("\n")[0]
        assert len(summary) > 20, f"{path} has no help text"
        assert summary.split()[0] in result.stdout, path


def test_version(cli, tmp_path):
    result = cli(tmp_path, "--version")
    assert result.exit_code == 0 and result.stdout.startswith("torchship ")


def project_with_registry(folder):
    """`folder` made a project (params.yaml, dvc.yaml) whose MLflow SQLite registry holds MODEL, with no version
    yet; returns an MlflowClient on it."""
    from mlflow import MlflowClient

    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(REPO / name, folder / name)
    (folder / "mlflow").mkdir()
    uri = f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(MODEL)
    return client


@pytest.fixture
def registry(tmp_path):
    """A project folder (params.yaml, dvc.yaml) whose MLflow SQLite registry holds v1 (tagged previous) and v2
    (champion): exactly what a promotion leaves behind. Versions point at no artifact: rollback and status
    read and move aliases and tags only."""
    client = project_with_registry(tmp_path)
    for bless in ("pass", "pass"):
        client.create_model_version(MODEL, source=str(tmp_path / "no-artifact"), tags={"bless": bless,
                                                                                      "git_commit": "0123456789abc"})
    client.set_registered_model_alias(MODEL, "champion", "2")
    client.set_model_version_tag(MODEL, "1", "previous", "replaced by v2")
    return tmp_path, client


def test_status_lists_versions_aliases_and_verdicts(cli, registry):
    folder, _ = registry
    result = cli(folder, "status")
    assert result.exit_code == 0, result.output
    assert f"{MODEL}: aliases champion → v2" in result.stdout
    assert "v2" in result.stdout and "v1" in result.stdout and "previous" in result.stdout
    assert "0123456789" in result.stdout


def test_status_without_a_registered_model(cli, tmp_path):
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "mlflow").mkdir()
    result = cli(tmp_path, "status")
    assert result.exit_code == 0 and "No registered versions" in result.stdout, result.output


def test_rollback_puts_the_previous_champion_back_once(cli, registry):
    folder, client = registry
    result = cli(folder, "rollback")
    assert result.exit_code == 0, result.output
    assert "v1 again" in result.stdout and "v2 tagged rejected" in result.stdout
    assert client.get_registered_model(MODEL).aliases == {"champion": 1}
    replaced = client.get_model_version(MODEL, "2").tags
    assert "rejected" in replaced and "previous" not in replaced  # a rolled-back version is no fallback
    # Nothing is tagged previous any more: a second rollback is refused, as one red paragraph, exit 2.
    again = cli(folder, "rollback")
    assert again.exit_code == 2
    assert "error:" in again.stderr and "nothing to roll back to" in again.stderr
    assert again.exception is None or isinstance(again.exception, SystemExit)
    assert client.get_registered_model(MODEL).aliases == {"champion": 1}


def test_an_unblessed_version_is_promoted_only_with_force_and_a_recorded_reason(cli, registry):
    folder, client = registry
    client.create_model_version(MODEL, source=str(folder / "no-artifact"),
                                tags={"bless": "fail", "bless_reasons": "worse than a few lines of scikit-learn"})
    refused = cli(folder, "promote", "3", "--reason", "looks fine to me")
    said = " ".join(refused.stderr.split())   # rich wraps long lines
    assert refused.exit_code == 2 and "v3 of synthetic-churn was not blessed" in said, refused.output
    assert "worse than a few lines of scikit-learn" in said and "--force" in said
    assert client.get_registered_model(MODEL).aliases == {"champion": 2}
    forced = cli(folder, "promote", "3", "--reason", "hotfix for incident 42", "--force")
    assert forced.exit_code == 0 and "is v3 (was v2, tagged previous) forced" in " ".join(forced.stdout.split())
    assert client.get_registered_model(MODEL).aliases == {"champion": 3}
    tags = client.get_model_version(MODEL, "3").tags
    assert tags["forced"] == "hotfix for incident 42" and "by hand (forced): hotfix for incident 42" in tags["promoted"]
    assert "previous" in client.get_model_version(MODEL, "2").tags   # rollback can undo it


def test_an_alias_moved_by_another_process_shows_in_status_and_a_blessed_version_is_promoted_by_hand(cli, registry):
    folder, client = registry
    other = subprocess.run(  # another process moves the alias through MLflow's API (as the MLflow UI does)
        [str(REPO / ".venv" / "bin" / "python"), "-c",
         "from mlflow import MlflowClient\n"
         f"uri = 'sqlite:///{folder / 'mlflow' / 'mlflow.db'}'\n"
         f"MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias('{MODEL}', 'champion', '1')"],
        capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]
    assert f"{MODEL}: aliases champion → v1" in cli(folder, "status").stdout
    promoted = cli(folder, "promote", "2", "--reason", "v1 misbehaves on weekends")
    assert promoted.exit_code == 0, promoted.output
    assert "is v2 (was v1, tagged previous)" in " ".join(promoted.stdout.split())
    assert f"{MODEL}: aliases champion → v2" in cli(folder, "status").stdout
    assert "by hand: v1 misbehaves on weekends" in client.get_model_version(MODEL, "2").tags["promoted"]



def test_rebaseline_is_an_explicit_audited_decision_for_incomparable_versions_only(cli, registry):
    folder, client = registry
    client.create_model_version(MODEL, source=str(folder / "no-artifact"), tags={
        "bless": "fail", "bless_outcome": "incomparable", "bless_reasons": "the champion's inputs differ"})
    # The outcome decides, never the wording: these reasons name comparability, the outcome is the baselines'.
    client.create_model_version(MODEL, source=str(folder / "no-artifact"), tags={
        "bless": "fail", "bless_outcome": "below baselines", "bless_reasons": "not comparable with scikit-learn"})
    worse = cli(folder, "rebaseline", "4", "--reason", "new columns")
    said = " ".join(worse.stderr.split())
    assert worse.exit_code == 2 and "more than comparability (below baselines:" in said, worse.output
    blessed = cli(folder, "rebaseline", "2", "--reason", "why not")
    assert blessed.exit_code == 2 and "torchship promote 2" in " ".join(blessed.stderr.split()), blessed.output
    done = cli(folder, "rebaseline", "3", "--reason", "the table gained a region column")
    assert done.exit_code == 0, done.output
    assert client.get_registered_model(MODEL).aliases == {"champion": 3}
    assert "the table gained a region column (replaces v2" in client.get_model_version(MODEL, "3").tags["rebaselined"]
    assert client.get_registered_model(MODEL).tags["baseline"] == "v3: the table gained a region column"
    assert "previous" in client.get_model_version(MODEL, "2").tags and "rebaselined" in cli(folder, "status").stdout

def test_a_user_error_is_one_red_paragraph(cli, tmp_path):
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    missing = cli(tmp_path, "ingest", "no-such-batch.csv")
    assert missing.exit_code == 2 and "no-such-batch.csv not found" in missing.stderr
    (tmp_path / "params.yaml").write_text("train:\n  epoch: 3\n")  # a typo'd key: params are airtight
    broken = cli(tmp_path, "status")
    assert broken.exit_code == 2 and "train.epoch" in broken.stderr and "Traceback" not in broken.output


STATE = ["data/prepare/train.parquet", "data/validate/docs/index.html", "data/train/model.pt",
         "data/export/model.onnx", "data/compress/variants/student.onnx", "data/profile/report.json",
         "data/quarantine/20260101-000000-abcdef-batch/reason.txt", "data/serve/requests.jsonl",
         "data/batches/accepted.parquet", "data/monitor/decisions.jsonl", "mlflow/mlflow.db",
         "mlflow/artifacts/1/model.onnx",
         ".prefect/db/prefect.db"]


def test_clean_removes_local_state_and_keeps_what_git_tracks(cli, tmp_path):
    project = make_project(tmp_path)
    for name in STATE:
        (project.root / name).parent.mkdir(parents=True, exist_ok=True)
        (project.root / name).write_text("state")

    refused = cli(project.root, "clean", input="n\n")
    assert refused.exit_code == 1 and "Will remove" in refused.stdout
    assert all((project.root / name).exists() for name in STATE)

    done = cli(project.root, "clean", "--yes")
    assert done.exit_code == 0 and "Clean." in done.stdout, done.output
    assert not [name for name in STATE if (project.root / name).exists()]
    assert not (project.root / ".prefect").exists() and not (project.root / "mlflow" / "artifacts").exists()
    stages = YAML(typ="safe").load((REPO / "dvc.yaml").read_text())["stages"]
    for stage in [name for name, spec in stages.items() if spec.get("outs")]:   # DVC ignores outs in .gitignore
        assert (project.root / "data" / stage / ".gitignore").exists(), stage
    tracked = subprocess.run(["git", "status", "--porcelain"], cwd=project.root, capture_output=True, text=True)
    assert tracked.stdout == "", "clean must never remove a tracked file:\n" + tracked.stdout
    assert "Nothing to clean." in cli(project.root, "clean", "--yes").stdout


SPAWNS: list[str] | None = None   # while a list: the audit hook below records every process this one starts


def _record_spawns(event: str, args: tuple) -> None:
    if SPAWNS is not None and event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system"):
        SPAWNS.append(f"{event} {args[:2]}")


def test_ui_names_the_configured_servers_and_starts_none(cli, tmp_path, monkeypatch):
    global SPAWNS
    from ruamel.yaml import YAML

    yaml = YAML()
    params = yaml.load((REPO / "params.yaml").read_text())
    params["tracking"]["uri"] = "https://mlflow.team.example:5443"
    with (tmp_path / "params.yaml").open("w") as handle:
        yaml.dump(params, handle)
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.team.example:4200/api")
    sys.addaudithook(_record_spawns)   # a hook cannot be removed: it records only while SPAWNS is a list
    SPAWNS = []
    try:
        result = cli(tmp_path, "ui", "--check")   # --check: a wrongly started server is stopped again
        spawned = list(SPAWNS)
    finally:
        SPAWNS = None
    assert spawned == []
    assert result.exit_code == 0, result.output
    assert "MLflow  https://mlflow.team.example:5443 (configured; nothing started)" in result.stdout
    assert "Prefect http://prefect.team.example:4200 (configured; nothing started)" in result.stdout
    assert "ready" not in result.stdout and not (tmp_path / ".prefect" / "ui-logs").exists()
