"""Images on the team stack: tests/integration/test_images.py's model, its drift loop where a team runs it, beside the
journey (tests/integration/test_journey.py) on the session's one stack (tests/conftest.py team_stack: same xdist
group, never a second stack), with hosts that share only the servers, the bucket and the git remote
(tests/helpers/hosts.py).

1. Host A commits an image project (packaged digits, the worked example of your own image module, tracking on the
   MLflow server, the DVC remote in the bucket, the docs' pull steps at the team's git remote), pushes it, runs
   `torchship deploy` (the deployments replace the journey's, whose runs have ended: one project's at a time) and
   `torchship run`: v1 is champion on the MLflow server, its prepared data in the bucket.
2. Host D, with a clone of the git remote and nothing else, runs `torchship serve`: it serves v1 and ships its
   request log (each image's statistics and embedding, no pixels) and the feedback to the bucket, under a prefix of
   its own (the journey's window and trigger decisions are the table model's).
3. A shifted image stream with its true labels goes to D; host A ingests labelled shifted images: they join the
   shared batch index (the model's tag on the MLflow server, the batch in the bucket), since the request log keeps
   no pixels to learn from.
4. The `monitor` deployment, run by host C's worker in a fresh clone, reads D's log from the bucket (the only way it
   reaches C), finds the drift, counts the images ingested on A through the shared index, and emits the drift event
   to the Prefect server. The event starts the `retrain` deployment on C's worker: it learns from those images,
   its version passes the gates, and the pipeline's canary (the challenger against the champion on replayed holdout
   images, on C) promotes it. D then serves it.
Two pipeline runs in all (v1 and the retrain); run it alone with `pytest -m stack`."""
from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from flows.cli.stack.servers import BUCKET
from tasks.core.schema_spec import load_schema
from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.decode import encode_png
from tasks.modalities.image.shards import read_metadata, read_pixels
from tasks.modalities.image.sources import packaged_digits, shift_images
from tests.conftest import TEAM_STACK_GROUP
from tests.helpers.hosts import Host, hosts, require_root
from tests.helpers.stack import evaluated, prefect_http, stack_cli
from tests.integration.test_journey import (
    RUN_TIMEOUT_S,
    champion_of,
    checked,
    first_run_of,
    git_remote,
    light_params,
    publish,
    run_deployment,
    serve_on_a_fresh_host,
    start_worker,
    stop,
    version_tags,
    wait_for_flow_run,
    wait_shipped,
    worker_log,
)

# Two tiny image pipeline runs, the monitor and a canary on a worker: ~8 min alone on 2 cores, more beside others
pytestmark = [pytest.mark.integration, pytest.mark.stack, pytest.mark.timeout(2400),
              pytest.mark.xdist_group(TEAM_STACK_GROUP)]
MODEL = "images-digits"
SHIP_TO = f"s3://{BUCKET}/image-serve-logs"   # D's request log, feedback and the trigger decisions: not the journey's
SHIFT = 0.8                                   # tests/integration/test_images.py's: drift is raised on it
STREAM, INGESTED = 200, 300                   # served shifted images (the window); labelled ones ingested
IMAGES = {
    "data": {"source": "images:digits"},
    # tests/integration/test_images.py's model: ~98% on the digits in a second of training, so the retrain's gates
    # and canary judge a model against a fair champion, not a coin toss
    "train": {"model": "docs.examples.own_image_model:TinyCNN", "epochs": 15, "lr": 0.01, "adapt": False,
              "batch_size": 64, "threads": 1},
    "serve": {"ship_to": SHIP_TO, "ship_seconds": 2},
    "monitor": {"window_rows": STREAM, "sample_rows": STREAM, "min_labelled": 20},
    # the retrain learns the shifted images its holdout now holds, so its mix of answers moves there: the canary
    # judges errors, latency and accuracy (as the journey's does; test_canary_live.py checks the PSI rollback)
    "canary": {"max_psi": 1.0},
}


@pytest.fixture(scope="module")
def team(team_stack):
    """The shared stack (up here without workers, as the journey has it) and three hosts in a folder of their own,
    removed on every way out."""
    require_root()
    root = Path(tempfile.mkdtemp(prefix="torchship-images-stack-", dir="/tmp"))   # the hosts traverse it
    root.chmod(0o711)
    try:
        stack_cli(team_stack, "up", "--workers", "0")
        with hosts(root / "hosts", "a", "c", "d") as made:
            yield root, evaluated(stack_cli(team_stack, "env")), made
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_body(images: np.ndarray) -> dict:
    return {"images": [base64.b64encode(encode_png(image)).decode() for image in images]}


def send_shifted_stream(url: str, project: Path) -> None:
    """STREAM shifted holdout images to the service, twenty a request, then each one's true label as feedback."""
    shape = image_shape(load_schema(project / "data/prepare/schema.json")).shape
    holdout = project / "data/prepare/holdout.parquet"
    chosen = np.resize(np.arange(len(read_metadata(holdout, "label"))), STREAM)
    pixels = shift_images(read_pixels(holdout, shape)[chosen], SHIFT, seed=1)
    labels = read_metadata(holdout, "label")["label"].astype(str).to_numpy()[chosen]
    with httpx.Client(base_url=url, timeout=60) as client:
        for start in range(0, STREAM, 20):
            answer = client.post("/predict", json=as_body(pixels[start:start + 20]))
            assert answer.status_code == 200, answer.text
            ids = [prediction["id"] for prediction in answer.json()["predictions"]]
            done = client.post("/feedback", json={"labels": [{"id": i, "label": label} for i, label in
                                                             zip(ids, labels[start:start + 20])]})
            assert done.status_code == 200, done.text


def ingest_labelled_shifted_images(host: Host, project: Path, env: dict[str, str]) -> str:
    """INGESTED labelled shifted digits (one folder per class) through `torchship ingest` on host A; its output."""
    digits, labels = packaged_digits()
    chosen = np.random.default_rng(7).permutation(len(digits))[:INGESTED]
    folder = host.home / "labelled-shifted"
    for i, (image, label) in enumerate(zip(shift_images(digits[chosen], SHIFT, seed=3), np.array(labels)[chosen])):
        (folder / label).mkdir(parents=True, exist_ok=True)
        (folder / label / f"shifted-{i}.png").write_bytes(encode_png(image))
    subprocess.run(["chown", "-R", f"{host.user}:{host.user}", str(folder)], check=True, timeout=60)
    return checked(host.run("torchship", "ingest", str(folder), cwd=project, env=env))


def runs_of(env: dict[str, str], deployment: str) -> frozenset[str]:
    """The ids of the deployment's flow runs so far (the journey's among them: its deployments had these names)."""
    with prefect_http(env) as prefect:
        found = prefect.get(f"/deployments/name/{deployment}").json()["id"]
        runs = prefect.post("/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [found]}}}).json()
    return frozenset(run["id"] for run in runs)


def test_drift_on_served_images_retrains_on_a_worker_from_ingested_images_and_the_canary_promotes_it(team):
    root, env, made = team
    host_a, host_c, host_d = made["a"], made["c"], made["d"]
    remote = git_remote(root, host_a, [host_c, host_d])
    logs = {name: root / f"host-{name}.log" for name in ("c", "d")}   # C's worker, D's service
    started: list[subprocess.Popen] = []
    try:
        project = publish(host_a, remote, env, {**light_params(), **IMAGES})
        checked(host_a.run("torchship", "deploy", cwd=project, env=env))
        began = time.monotonic()
        ran = checked(host_a.run("torchship", "run", cwd=project, env=env, timeout=RUN_TIMEOUT_S))
        print(f"\nv1 on host A: {time.monotonic() - began:.0f} s")
        assert champion_of(env, MODEL) == "1", ran[-3000:]
        service, url = serve_on_a_fresh_host(host_d, remote, env, logs["d"], "1")
        started.append(service)
        send_shifted_stream(url, project)
        ingested = ingest_labelled_shifted_images(host_a, project, env)
        wait_shipped(env, STREAM, ship_to=SHIP_TO)
        retrains = runs_of(env, "torchship-retrain/retrain")
        start_worker(host_c, "host-c-images", logs["c"], env, started)
        began = time.monotonic()
        monitored = wait_for_flow_run(env, run_deployment(host_a, project, env, "torchship-monitor/monitor"))
        assert monitored["state_type"] == "COMPLETED", worker_log(logs["c"])[-5000:]
        assert "trigger fired" in worker_log(logs["c"]), worker_log(logs["c"])[-5000:]
        retrain = wait_for_flow_run(env, first_run_of(env, "torchship-retrain/retrain", known=retrains))
        print(f"monitor and retrain on host C's worker: {time.monotonic() - began:.0f} s")
        assert retrain["state_type"] == "COMPLETED", worker_log(logs["c"])[-5000:]
        deadline = time.monotonic() + 60   # D follows the alias (serve.poll_seconds)
        while (health := httpx.get(f"{url}/health", timeout=30).json()).get("champion") != "2":
            assert time.monotonic() < deadline, health
            time.sleep(1)
    finally:
        for process in reversed(started):
            stop(process)
    assert "batch accepted" in " ".join(ingested.split()), ingested[-2000:]
    assert runs_of(env, "torchship-retrain/retrain") - retrains == {retrain["id"]}   # one event, one retrain
    # the event carried the ingested images' newest time; the retrain read them through the shared index on C
    started_with = retrain["parameters"]
    assert float(started_with["labels_until"]) > 0 and "every guard passed" in started_with["reason"], started_with
    assert "── train ──" in worker_log(logs["c"])
    tags = version_tags(env, "2", MODEL)
    assert tags.get("trigger") == "retrain" and tags.get("retrain_batch", "").endswith(".images.parquet"), tags
    assert tags["retrain_batch"] in tags.get("data_batches", ""), tags
    assert tags.get("bless") in ("pass", "warn") and "promoted" in tags, tags   # the gates, then the canary's steps
    assert any(key.startswith("canary.") for key in tags), tags
    assert champion_of(env, MODEL) == "2"
