"""Two writers at once in one project folder: while a first run holds the workspace (here the test holds its lock, as
a running `torchship run` does, from a thread with a context of its own), a second `torchship run` with other
`--set` values, a `torchship ingest` and the pipeline flow a deployment starts are each refused before they write
anything: params.yaml, data/source.json, dvc.lock and data/batches/ stay byte for byte as the first run left them,
so its stages (and the dvc.lock they record) see its own params only. The commands run in this process (typer's
CliRunner) against the session's Prefect server, where the workspace limit lives."""
from __future__ import annotations

import contextvars
import hashlib
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tests.helpers.images import CLASSES, shapes_folder

pytestmark = pytest.mark.reliability
STATE = (".prefect",)   # Prefect's own state (the test's holder record): not the project's inputs


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` but Prefect's state -> its sha256, every folder -> "dir"."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.relative_to(root).parts[0] in STATE:
            continue
        found[str(path.relative_to(root))] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture()
def held(tmp_path, monkeypatch, prefect_server):
    """A project a first run holds: its params, source fingerprint, dvc.lock and an accepted batch on disk, an image
    schema (so an ingest has a model to judge for), and the workspace lock held until the test ends."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.workspace.lock import workspace_lock

    project = tmp_path / "project"
    (project / "data" / "batches").mkdir(parents=True)
    (project / "params.yaml").write_text("data:\n  rows: 500\n")
    (project / "dvc.yaml").write_text("stages: {}\n")
    (project / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (project / "data" / "source.json").write_text('{"source": "synthetic", "rows": 500}\n')
    (project / "data" / "batches" / "20260101-000000-first.parquet").write_bytes(b"the first run's batch")
    schema = Schema(source="t", target="label", classes=CLASSES, modality="image",
                    inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())
    (project / "data" / "prepare").mkdir()
    (project / "data" / "prepare" / "schema.json").write_text(schema.to_json())
    shapes_folder(tmp_path / "batch", count=8, side=16)
    monkeypatch.chdir(project)
    saved = dict(os.environ)
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with workspace_lock("the first run", 30):
            taken.set()
            done.wait(120)

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url()}):
        holder = threading.Thread(target=contextvars.copy_context().run, args=(hold,), daemon=True)
        holder.start()
        assert taken.wait(60), "the test could not take the workspace lock"
        try:
            yield project, tmp_path / "batch"
        finally:
            done.set()
            holder.join(30)
            os.environ.clear()
            os.environ.update(saved)


def test_a_second_run_and_an_ingest_are_refused_before_writing_anything(held):
    from flows.cli import app

    project, batch = held
    before = tree(project)
    second = CliRunner().invoke(app, ["run", "--set", "data.rows=700", "--set", "retrain.workspace_wait_s=0.5"])
    assert second.exit_code != 0 and "workspace is busy" in second.output, second.output
    assert tree(project) == before, "the second run wrote before it held the workspace"
    assert "rows: 500" in (project / "params.yaml").read_text()
    ingest = CliRunner().invoke(app, ["ingest", str(batch)])
    assert ingest.exit_code != 0 and "workspace is busy" in ingest.output, ingest.output
    assert tree(project) == before and (batch / "circle").is_dir(), "the ingest wrote before it held the workspace"


def test_the_pipeline_flow_holds_the_workspace_before_it_writes(held):
    from flows.pipeline import pipeline
    from tasks.core.errors import TorchshipError
    from tasks.workspace.lock import WorkspaceBusy

    project, _ = held
    (project / "params.yaml").write_text("data:\n  rows: 700\nretrain:\n  workspace_wait_s: 0.5\n")
    before = tree(project)
    with pytest.raises(TorchshipError) as refused:
        pipeline.fn(params_file="params.yaml")   # as a deployment's run starts it: no CLI in front
    assert tree(project) == before, "the flow refreshed the source or pulled batches before it held the workspace"
    assert isinstance(refused.value, WorkspaceBusy), refused.value
