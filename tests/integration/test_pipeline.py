"""The whole pipeline through the real CLI, in a throwaway clone: Prefect, DVC, MLflow, GX, a real service."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tasks.registry.read import download_onnx
from tasks.stages.stage_list import PREFECT_STEPS, pipeline_stages
from tests.conftest import REPO
from tests.helpers import dvc_clean, light_run_flags, project_registry, workspace_restored

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"
OWN_TABLE_MODEL = "docs.examples.own_table_model:ResidualMLP"
STAGES = pipeline_stages(REPO)


def test_first_run_registers_a_champion_with_lineage(tiny_pipeline, tmp_path):
    project, first = tiny_pipeline
    for step in STAGES + [step.name for step in PREFECT_STEPS]:
        assert step in first.stdout
    # The closing line: what this run did to the registry.
    assert f"Registry: registered v1 of {MODEL}; aliases moved: champion none → v1." in " ".join(first.stdout.split())
    registry = project.registry(MODEL)
    assert set(registry["aliases"]) >= {"champion"}
    tags = registry["versions"][registry["aliases"]["champion"]]
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=project.root, text=True).strip()
    assert tags["git_commit"] == head
    # The fixture committed every file and a run changes none that git tracks (--set runs: the test below).
    assert tags["git_dirty"] == "false"
    lock = (project.root / "dvc.lock").read_text()
    assert tags["dvc_train_md5"] and tags["dvc_train_md5"] in lock
    assert len(tags["artifact_sha256"]) == 64
    client, champion = project_registry(project), registry["aliases"]["champion"]
    # the registered file is byte-identical to the blessed one: its tag can verify it
    served = download_onnx(client, MODEL, champion, tmp_path)
    assert hashlib.sha256(served.read_bytes()).hexdigest() == tags["artifact_sha256"]
    version = client.get_model_version(MODEL, champion)
    card = f"{version.description}\n{sorted(a.path for a in client.list_artifacts(version.run_id))}"
    for section in ("### Data", "### Training", "### Quality on the holdout", "### Gates", "### Serving benchmark",
                    "### Lineage", "logistic regression (scikit-learn)", "'model_card.html'"):
        assert section in card, card
    assert tags["bless"] == "pass" and tags["bless_outcome"] == "first model"   # typed: what rebaseline reads
    first_entry = json.loads(project.python(   # the alias history's first entry: this run's move, by its flow run
        "from tasks.config import load_params\nfrom tasks.registry.history import read_history\n"
        "from tasks.registry.read import registry_client\n"
        f"print(read_history(registry_client(load_params().tracking), '{MODEL}')[0].model_dump_json())"
    ).strip().splitlines()[-1])
    assert (first_entry["alias"], first_entry["from_version"], first_entry["to_version"]) == ("champion", None, "1")
    assert re.fullmatch(r"pipeline run [0-9a-f-]{36}", first_entry["actor"]), first_entry["actor"]
    assert "model_card.md" in first_entry["evidence"] and "first model" in first_entry["reason"]


def summary_row(stdout: str, step: str) -> tuple[str, str]:
    """(status, headline) of a step in the end-of-run table, the headline's wrapped lines joined."""
    status, headline, inside = "", [], False
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 4:
            continue
        if cells[0]:
            inside = cells[0] == step
            status = cells[1] if inside else status
        if inside:
            headline.append(cells[3])
    return status, " ".join(headline)


def test_the_first_run_smoke_tests_the_champion_on_the_canary_service_with_labelled_replayed_rows(tiny_pipeline):
    _, first = tiny_pipeline
    status, headline = summary_row(first.stdout, "canary")
    # No challenger on a first run: the champion alone answers holdout rows replayed to the canary's own service,
    # their labels posted back as feedback and joined from its logs (every answered row labelled).
    answered = re.search(r"smoke test only \(no challenger\): champion v1 answered (\d+) requests, 0 errors, "
                         r"p95 [\d.]+ ms, accuracy [\d.]+ on (\d+) labelled", headline)
    assert status == "pass" and answered, headline
    assert int(answered[1]) == int(answered[2]) > 0, headline


def test_reports_exist_and_dvc_is_clean(tiny_pipeline):
    project, _ = tiny_pipeline
    for path in ("data/validate/docs/index.html", "data/train/plots/learning_curves.png",
                 "data/train/plots/confusion_matrix.png", "data/profile/latency.png", "data/export/model.onnx",
                 "data/export/model.pt2", "data/compress/variants/model.int8.onnx",
                 "data/compress/variants/student.int8.onnx", "data/compress/student/model.pt"):
        assert (project.root / path).stat().st_size > 0, path
    status = project.dvc("status")
    assert dvc_clean(status.stdout), status.stdout
    dag = project.dvc("dag").stdout
    chain = [dag.index(stage) for stage in STAGES if stage != "baseline"]   # baseline hangs off prepare alone
    assert chain == sorted(chain) and dag.index("baseline") > dag.index("prepare"), dag


def test_a_table_projects_stages_rerun_for_table_code_and_not_for_image_code(tiny_pipeline):
    """The stages' code deps follow the configured modality (tasks/stages/code_deps.py): on this table project,
    editing image decoding leaves prepare current, editing the table parser makes it stale."""
    project, _ = tiny_pipeline
    image, table = (project.root / "tasks/modalities/image/decode.py", project.root / "tasks/modalities/table/parse.py")
    originals = {path: path.read_text() for path in (image, table)}
    try:
        image.write_text(originals[image] + "\n# an edit of image code\n")
        assert dvc_clean(project.dvc("status", "prepare").stdout)
        table.write_text(originals[table] + "\n# an edit of table code\n")
        stale = project.dvc("status", "prepare").stdout
        assert "tasks/modalities/table/parse.py" in stale and "modified" in stale, stale
    finally:
        for path, text in originals.items():
            path.write_text(text)
    assert dvc_clean(project.dvc("status").stdout)


def test_local_dvc_remote_works_out_of_the_box(tiny_pipeline, tmp_path):
    """A plain `dvc push` fills an empty default remote with the workspace's outputs (the run's register step
    already pushed to the project's remote: that one is set aside meanwhile)."""
    project, _ = tiny_pipeline
    remote = project.root / ".dvc-remote"
    shutil.move(remote, tmp_path / "pushed-by-register")
    try:
        push = project.dvc("push")
        assert push.returncode == 0, push.stderr
        pushed = {path.relative_to(remote).as_posix() for path in remote.rglob("*") if path.is_file()}
    finally:
        shutil.rmtree(remote, ignore_errors=True)
        shutil.move(tmp_path / "pushed-by-register", remote)
    lock = YAML(typ="safe").load((project.root / "dvc.lock").read_text())
    outs = {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}
    for name in ("data/prepare/train.parquet", "data/train/model.pt", "data/export/model.onnx"):
        assert f"files/md5/{outs[name][:2]}/{outs[name][2:]}" in pushed, (name, sorted(pushed))


def test_rerun_with_nothing_changed_skips_and_registers_nothing(tiny_pipeline):
    project, _ = tiny_pipeline
    before = project.registry(MODEL)
    again = project.torchship("run")
    assert again.returncode == 0, again.stderr[-3000:]
    for stage in STAGES:
        assert f"│ {stage:<8} │ skipped" in again.stdout.replace("┃", "│"), again.stdout
    after = project.registry(MODEL)
    assert after["versions"].keys() == before["versions"].keys()
    assert after["aliases"] == before["aliases"]
    assert "no new version" in again.stdout
    said = " ".join(again.stdout.split())
    assert f"Registry: no version of {MODEL} was registered; aliases unchanged." in said
    # the champion's own file: nothing to judge again, nothing to smoke-test
    champion = before["aliases"]["champion"]
    cells = " ".join(again.stdout.replace("│", " ").split())   # the summary's wrapped cells, joined
    assert f"unchanged: the candidate is champion v{champion}'s own file" in cells, again.stdout[-3000:]
    assert f"champion v{champion} unchanged" in cells and "smoke test only" not in cells


def test_plan_names_what_would_rerun_without_changing_anything(tiny_pipeline):
    project, _ = tiny_pipeline
    params_before = (project.root / "params.yaml").read_bytes()
    plan = project.torchship("plan", "--set", "train.epochs=3")
    assert plan.returncode == 0, plan.stderr
    lines = {line.split("│")[1].strip(): line for line in plan.stdout.splitlines() if line.count("│") >= 3}
    assert "skip" in lines["prepare"] and "skip" in lines["validate"]
    assert "run" in lines["train"] and "train.epochs" in plan.stdout
    assert (project.root / "params.yaml").read_bytes() == params_before


def test_changed_params_make_a_new_version_that_is_promoted_or_rejected(tiny_pipeline):
    """The new training is the worked example of your own table model (docs/own-model.md): a module of the project
    through every stage, the registry, and a lineage that holds the run's own params."""
    project, _ = tiny_pipeline
    before = project.registry(MODEL)
    with workspace_restored(project, MODEL):  # the session's project is as the first run left it afterwards
        # Only a new training matters here (light_run_flags: the first run proved compile, dynamo and the student).
        changed = project.torchship("run", "--set", "train.seed=7", "--set", "train.epochs=1",
                                    "--set", f"train.model={OWN_TABLE_MODEL}", *light_run_flags())
        after = project.registry(MODEL)
    assert changed.returncode == 0, changed.stdout[-3000:] + changed.stderr[-3000:]
    # prepare and validate depend on no train.* key: DVC must skip them.
    assert "│ prepare  │ skipped" in changed.stdout and "│ train    │ ran" in changed.stdout
    new = sorted(set(after["versions"]) - set(before["versions"]), key=int)
    assert len(new) == 1
    tags = after["versions"][new[0]]
    if after["aliases"]["champion"] == new[0]:
        old = before["aliases"]["champion"]
        assert "previous" in after["versions"][old]
    elif "canary_inconclusive" in tags:   # a worrying drop the replay's few rows could not call: nothing moved
        assert after["aliases"]["challenger"] == new[0] and "rejected" not in tags
        assert after["aliases"]["champion"] == before["aliases"]["champion"]
    else:
        assert "rejected" in tags and tags["rejected"]
        assert after["aliases"]["champion"] == before["aliases"]["champion"]
    assert tags["parent_version"] == before["aliases"]["champion"]
    assert tags["git_dirty"] == "true"   # the --set values were in params.yaml, uncommitted, while it registered
    assert project.registry(MODEL)["aliases"] == before["aliases"]
    assert dvc_clean(project.dvc("status").stdout)
    # The restored tree no longer holds the --set values: only the version's own lineage can rebuild it.
    assert "seed: 7" not in (project.root / "params.yaml").read_text()
    assert tags["dvc_push"] == "pushed to the DVC remote" and "params.yaml" in tags["lineage_files"]
    # `torchship rebuild` from such a lineage runs end to end in tests/integration/test_journey.py, on a host with
    # nothing but a clone and the servers; here the lineage must hold the run's own params.
    from mlflow import MlflowClient

    uri = f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run_id = client.get_model_version(MODEL, new[0]).run_id
    logged = Path(client.download_artifacts(run_id, "lineage/params.yaml", str(project.root.parent / "lineage")))
    assert "seed: 7" in logged.read_text() and OWN_TABLE_MODEL in logged.read_text()


def test_every_variant_carries_its_proof(tiny_pipeline):
    """Parity for each exported variant, the accuracy budget with its interval for each compressed one,
    and the served variant is one that passed."""
    project, _ = tiny_pipeline
    read = lambda path: json.loads((project.root / path).read_text())  # noqa: E731
    parity, compress, profile = read("data/export/parity.json"), read("data/compress/report.json"), read(
        "data/profile/report.json")
    for name in ("onnx", "pt2", "compile"):
        assert parity[name]["gate"]["status"] == "pass", parity[name]
    assert parity["exporter"] == "dynamo"
    assert compress["student_parity"]["gate"]["status"] == "pass"
    assert {"onnx-int8", "student-onnx-fp32", "student-onnx-int8"} <= compress["variants"].keys()
    assert "eager-int8" not in compress["variants"]   # torch.ao.quantization is leaving PyTorch (tasks/compress.py)
    for name, entry in compress["variants"].items():
        drop = entry["drop"]
        assert drop["low"] <= drop["high"] and abs(drop["drop"] - (drop["low"] + drop["high"]) / 2) < 0.05, name
        assert entry["publishable"] == (drop["drop"] <= compress["max_drop"]), name
        if "path" in entry:
            assert len(entry["sha256"]) == 64 and (project.root / entry["path"]).stat().st_size == entry["bytes"]
    selected = profile["selected"]
    assert selected == "onnx-fp32" or compress["variants"][selected]["publishable"]
    # dynamic int8 answers a row by its batch (activations quantised per call): timed, never served
    assert set(profile["not_served"]) == {"onnx-int8", "student-onnx-int8"} & set(profile["variants"])
    assert profile["variants"][selected]["p50_us"] == min(
        profile["variants"][name]["p50_us"] for name in profile["variants"]
        if name == "onnx-fp32" or name not in profile["not_served"]
        and compress["variants"].get(name, {}).get("publishable") and "path" in compress["variants"][name])
