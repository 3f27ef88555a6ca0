"""The image modality end to end, once, through the real CLI and servers: `torchship run` on the packaged digits,
with the worked example of your own image module, makes a champion with its lineage and model card; a broken module
fails before any stage, naming the rule; `torchship serve` answers a PNG upload and a base64 body with the
registered graph's own probabilities, and so does `mlflow models serve` of the same version; bad image batches are
named file by file and quarantined while the champion keeps serving; a shifted image stream raises drift where clean
traffic does not. Proven once elsewhere: the image endpoint under a schema fuzzer (in memory,
tests/reliability/test_fuzz_images.py), and what the drift starts, a retrain that learns from ingested labelled
shifted images, passes the gates and is promoted by the canary, where a team runs it
(tests/integration/test_images_stack.py; the live canary on a service's own traffic: the journey's for tables,
tests/integration/test_text.py's for texts)."""
from __future__ import annotations

import base64
import json
import os

import httpx
import numpy as np
import pandas as pd
import pytest

from tasks.core.env import TOKEN_ENV
from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready
from tasks.modalities.image.decode import encode_png
from tasks.modalities.image.shards import read_metadata, read_pixels
from tasks.modalities.image.sources import shift_images
from tests.conftest import BIN, make_project
from tests.helpers.images import add_bad_files

MODEL = "images-digits"
TOKEN = "image-canary-token-never-guessed"
IMAGES = {
    "data": {"source": "images:digits"},
    # the worked example of your own image model (docs/own-model.md): probed, trained, exported, served, watched
    # 15 epochs at lr 0.01: ~98% on the digits in a second of training (5 at 0.001 left it near 45%)
    "train": {"model": "docs.examples.own_image_model:TinyCNN", "epochs": 15, "lr": 0.01, "adapt": False,
              "batch_size": 64, "threads": 1},
    "distill": {"enabled": False},   # the student's path is the table run's and the benchmark's (bench/bench_images.py)
    "monitor": {"window_rows": 200, "sample_rows": 200, "min_labelled": 20},
}
SHIFT = 0.8


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_server):
    project = make_project(tmp_path_factory.mktemp("images") / "project", IMAGES, prefect=prefect_server)
    done = project.torchship("run", timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project


@pytest.fixture(scope="module")
def service(project, tmp_path_factory):
    """`torchship serve` on the project (request log on, admin token set), its URL once it serves the champion."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", **{TOKEN_ENV: TOKEN})
    child = start_child("torchship serve", [str(BIN / "torchship"), "serve", "--port", str(port)],
                        tmp_path_factory.mktemp("serve") / "serve.log", env=env, cwd=project.root)
    url = f"http://127.0.0.1:{port}"
    with running([child]):
        wait_until_ready(child, http_ok(f"{url}/health", lambda body: body.get("champion") == "1"), 120)
        yield url
    assert "Traceback" not in child.output_tail(100_000), child.output_tail()


def holdout(project) -> tuple[np.ndarray, pd.Series]:
    schema = json.loads((project.root / "data/prepare/schema.json").read_text())
    shape = (schema["inputs"]["height"], schema["inputs"]["width"], schema["inputs"]["channels"])
    path = project.root / "data/prepare/holdout.parquet"
    return read_pixels(path, shape), read_metadata(path, "label")["label"].astype(str)


def as_body(images: np.ndarray) -> dict:
    return {"images": [base64.b64encode(encode_png(image)).decode() for image in images]}


def probabilities(answer: dict, classes: list[str]) -> np.ndarray:
    return np.array([[p["probabilities"][c] for c in classes] for p in answer["predictions"]])


def test_the_run_makes_an_image_champion_with_lineage_and_a_model_card(project):
    registry = project.registry(MODEL)
    assert registry["aliases"] == {"champion": "1"}
    tags = registry["versions"]["1"]
    assert tags["git_commit"] and tags["dvc_train_md5"] and len(tags["artifact_sha256"]) == 64
    assert tags["data_source"] == "images:digits" and tags["bless"] in ("pass", "warn")
    from mlflow import MlflowClient

    uri = f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"
    card = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version(MODEL, "1").description
    assert "images 8x8 L" in card and "### Lineage" in card, card


def test_serve_answers_an_upload_and_a_base64_body_with_the_graphs_probabilities(project, service):
    pixels, _ = holdout(project)
    classes = json.loads((project.root / "data/prepare/schema.json").read_text())["classes"]
    files = [encode_png(image) for image in pixels[:4]]
    uploaded = httpx.post(f"{service}/predict", files=[("image", (f"{i}.png", f, "image/png"))
                                                       for i, f in enumerate(files)], timeout=30)
    encoded = httpx.post(f"{service}/predict", json=as_body(pixels[:4]), timeout=30)
    assert uploaded.status_code == encoded.status_code == 200, (uploaded.text, encoded.text)
    from tasks.core.runtime import open_onnx

    graph = open_onnx(project.root / "data/profile/model.onnx", 1)
    expected = graph.run(["probabilities"], {"image": pixels[:4]})[0]
    for answer in (uploaded.json(), encoded.json()):
        np.testing.assert_allclose(probabilities(answer, classes), expected, rtol=1e-5, atol=1e-6)


def test_mlflow_models_serve_answers_the_same_probabilities(project, service, tmp_path):
    pixels, _ = holdout(project)
    classes = json.loads((project.root / "data/prepare/schema.json").read_text())["classes"]
    port = free_port()
    env = {**project.env(), "MLFLOW_TRACKING_URI": f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    child = start_child("mlflow models serve", [str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{MODEL}/1",
                                                "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                        tmp_path / "mlflow.log", cwd=project.root, env=env)
    with running([child]):
        wait_until_ready(child, http_ok(f"http://127.0.0.1:{port}/ping"), timeout=120)
        theirs = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"inputs": pixels[:6].tolist()}, timeout=60)
    assert theirs.status_code == 200, theirs.text
    ours = httpx.post(f"{service}/predict", json=as_body(pixels[:6]), timeout=30).json()
    np.testing.assert_allclose(np.array(theirs.json()["predictions"]["probabilities"]), probabilities(ours, classes),
                               rtol=1e-5, atol=1e-6)


def test_a_bad_image_batch_is_named_file_by_file_and_quarantined_while_the_champion_serves(project, service,
                                                                                          tmp_path):
    """The bad inputs users bring (tests/helpers/images.py) beside new good images: the batch is refused at the
    door, every bad file named with its rule and kept in quarantine, and nothing joins the training data."""
    from tasks.modalities.image.sources import packaged_digits

    digits, labels = packaged_digits()
    fresh = shift_images(digits[:40], 0.3, seed=11)   # new images: the door also refuses ones it already holds
    folder = tmp_path / "bad-batch"
    for i, (image, label) in enumerate(zip(fresh, labels[:40])):
        (folder / label).mkdir(parents=True, exist_ok=True)
        (folder / label / f"{i}.png").write_bytes(encode_png(image))
    bad = add_bad_files(folder, sorted({*labels[:40]}), "L")
    refused = project.torchship("ingest", str(folder), timeout=300)
    assert refused.returncode != 0, refused.stdout[-2000:]
    said = refused.stdout + refused.stderr
    for name, rule in bad.items():
        assert name in said and rule in said, (name, rule, said[-4000:])
    [quarantine] = [p for p in (project.root / "data/quarantine").iterdir() if p.name.endswith("images")]
    report = json.loads((quarantine / "report.json").read_text())
    assert set(bad) <= set(report["files"])
    bomb = next(name for name in bad if name.endswith("bomb.png"))
    assert (quarantine / "files" / bomb).read_bytes() == (folder / bomb).read_bytes()
    assert not list((project.root / "data/batches").glob("*.images.parquet"))   # nothing joined the training data
    pixels, _ = holdout(project)
    assert httpx.get(f"{service}/health", timeout=10).json()["champion"] == "1"
    assert httpx.post(f"{service}/predict", json=as_body(pixels[:1]), timeout=30).status_code == 200


BROKEN = """
from torch import nn


class NaNs(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.body = nn.Linear(layout.channels, layout.n_classes)

    def forward(self, x):
        return self.body(x.float().mean((1, 2))) * float("nan")
"""


def test_a_broken_image_module_fails_before_any_stage_naming_the_rule(project):
    """Through the real CLI once: exit 2, the rule named, no stage started, the registry untouched. The other
    broken classes are refused by the same probe in-process (tests/model/test_own_image_module.py)."""
    (project.root / "broken_nets.py").write_text(BROKEN)
    before = project.registry(MODEL)
    refused = project.torchship("run", "--set", "train.model=broken_nets:NaNs", timeout=120)
    said = " ".join(refused.stderr.split())   # the console folds long lines
    assert refused.returncode == 2 and "finite logits" in said and "nothing was trained" in said, said[-2000:]
    assert "prepare" not in refused.stdout   # no stage started
    assert project.registry(MODEL) == before


def send(url: str, images: np.ndarray, labels: pd.Series) -> None:
    """Each image as its own request, then its true label as feedback."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for start in range(0, len(images), 20):
            ids = []
            for image in images[start:start + 20]:
                answer = client.post("/predict", json=as_body(image[None]))
                assert answer.status_code == 200, answer.text
                ids.append(answer.json()["predictions"][0]["id"])
            client.post("/feedback", json={"labels": [{"id": i, "label": label} for i, label in
                                                       zip(ids, labels.iloc[start:start + 20])]})


def monitor(project, *args: str) -> dict:
    """`torchship monitor ARGS`: the decision it wrote."""
    done = project.torchship("monitor", *args, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((project.root / "data/monitor/latest.json").read_text())


def test_a_shifted_image_stream_raises_drift_and_clean_traffic_does_not(project, service):
    pixels, labels = holdout(project)
    clean = np.resize(np.arange(len(pixels)), 200)
    send(service, pixels[clean], labels.iloc[clean])
    quiet = monitor(project, "--report-only")
    assert quiet["gate"]["status"] != "fail", quiet["gate"]
    send(service, shift_images(pixels[clean], SHIFT, seed=1), labels.iloc[clean])
    drifted = monitor(project, "--report-only")
    assert drifted["gate"]["status"] == "fail", drifted["gate"]
    found = drifted["findings"]["features"]
    assert found["brightness"]["drifted"] and found["embedding"]["drifted"], found
    report = project.root / drifted["report"]
    assert report.exists() and report.with_name(f"{report.stem}-embeddings.html").exists()
