"""The text modality end to end, once, through the real CLI and servers: `torchship run --set
data.source=text:tickets` (a small generated set) makes a champion with its lineage (the tokenizer's through the
schema's hash) and a model card; `torchship serve` answers raw strings with the registered graph's probabilities, and
so do ONNX Runtime and `mlflow.pyfunc` (the loader `mlflow models serve` uses), on the holdout texts and the
adversarial strings; the request log keeps no text; the text endpoint under a schema fuzzer answers no 5xx; a bad
text batch is named file by file and quarantined while the champion keeps serving; a topic shift moves what the
monitor watches (descriptors and the embedding) where clean traffic does not; and labelled shifted texts, ingested,
are what the drift-started retrain learns from: it goes through the gates, waits for approval, and the live canary
promotes it."""
from __future__ import annotations

import json
import subprocess

import httpx
import numpy as np
import pytest

from tasks.modalities.text.gate import ADVERSARIAL
from tasks.modalities.text.generated import generate_tickets
from tasks.modalities.text.shards import read_metadata, read_texts
from tasks.registry.approvals import WAITING
from tests.conftest import BIN, make_project
from tests.helpers.serve import serving
from tests.helpers.traffic import LiveTraffic

MODEL = "text-tickets"
TOKEN = "text-canary-token-never-guessed"
TEXT = {
    "data": {"source": "text:tickets"},
    # 600 tickets: with 400 the validation split (the monitor's reference) was too few texts for a weak model's
    # predicted classes to match clean traffic's
    "text": {"generated": 600},
    # the default text family on a few hundred texts: seconds of training (the Transformer's path is
    # tests/model/test_text_models.py's and the benchmark's)
    "train": {"model": "bag", "epochs": 12, "adapt": False, "batch_size": 32, "threads": 1,
              "model_args": {"bag": {"dim": 32, "buckets": 2048}}},
    "distill": {"enabled": False},   # compress still builds and gates the dynamic int8 variant
    "monitor": {"window_rows": 200, "sample_rows": 200, "min_labelled": 20},
    "retrain": {"min_new_labels": 100, "cooldown_minutes": 0},
    "promotion": {"approval": "required"},   # the retrain waits for a person; then the live canary decides
}
SHIFT = 1.0   # generate_tickets' drift: new products, the chat register and its own words for each problem


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_server):
    project = make_project(tmp_path_factory.mktemp("texts") / "project", TEXT, prefect=prefect_server)
    done = project.torchship("run", timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project


@pytest.fixture(scope="module")
def service(project, tmp_path_factory):
    """`torchship serve` on the project (request log on, admin token set), its URL once it serves the champion."""
    with serving(project.root, tmp_path_factory.mktemp("serve"), TOKEN) as url:
        yield url


def schema_of(project) -> dict:
    return json.loads((project.root / "data/prepare/schema.json").read_text())


def test_the_run_makes_a_text_champion_with_lineage_and_a_model_card(project):
    from mlflow import MlflowClient

    from tasks.core.artifacts import sha256_file

    registry = project.registry(MODEL)
    assert registry["aliases"] == {"champion": "1"}
    tags = registry["versions"]["1"]
    assert tags["git_commit"] and tags["dvc_train_md5"] and tags["dvc_schema_md5"]   # the tokenizer rides in it
    assert tags["artifact_sha256"] == sha256_file(project.root / "data/profile/model.onnx")
    assert tags["data_source"] == "text:tickets" and tags["bless"] in ("pass", "warn")
    uri = f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"
    card = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version(MODEL, "1").description
    sha = schema_of(project)["inputs"]["tokenizer_sha256"]
    assert "texts (column 'text')" in card and sha[:12] in card and "### Lineage" in card, card
    raw = json.loads((project.root / "data/profile/report.json").read_text())["raw_model"]["gate"]
    assert raw["status"] == "pass" and "the served graph's own front end" in raw["reasons"][0], raw


def test_pyfunc_onnx_runtime_and_the_service_answer_raw_strings_alike(project, service):
    """Within 1e-5 on the holdout texts and the adversarial strings; the request log keeps no text."""
    from tasks.core.runtime import open_onnx
    from tasks.modalities.text.graph import text_feed

    texts = read_texts(project.root / "data/prepare/holdout.parquet") + list(ADVERSARIAL)
    classes = schema_of(project)["classes"]
    graph = open_onnx(project.root / "data/profile/model.onnx", 1).run(["probabilities"], text_feed(texts))[0]
    answer = httpx.post(f"{service}/predict", json={"texts": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    served = np.array([[p["probabilities"][c] for c in classes] for p in answer.json()["predictions"]])
    (project.root / "texts.json").write_text(json.dumps(texts))
    pyfunc = np.array(json.loads(project.python(
        "import json, mlflow.pyfunc, numpy as np, pandas as pd\n"
        f"mlflow.set_tracking_uri('sqlite:///{project.root / 'mlflow' / 'mlflow.db'}')\n"
        f"model = mlflow.pyfunc.load_model('models:/{MODEL}/1')\n"
        "texts = json.load(open('texts.json'))\n"
        "print(json.dumps(np.asarray(model.predict(pd.DataFrame({'text': texts}))['probabilities']).tolist()))\n"
    ).splitlines()[-1]))
    for name, got in (("the service", served), ("mlflow.pyfunc", pyfunc)):
        assert np.abs(got - graph).max() <= 1e-5, name
    assert graph.max(axis=1).mean() > 0.5   # a trained model: the comparison is not of uniform answers
    logged = [json.loads(line) for line in (project.root / "data/serve/requests.jsonl").read_text().splitlines()]
    features = logged[-1]["features"]
    assert {"chars", "words", "non_letter_share", "oov_share", "embedding"} <= set(features)
    assert "text" not in features and not any(texts[0] in json.dumps(line) for line in logged)


def test_the_text_endpoint_under_a_schema_fuzzer_answers_no_5xx(service):
    from tests.helpers.fuzz import fuzz_operations

    sent, problems = fuzz_operations(service, paths={"/predict"}, positive=40, negative=40)
    assert not problems, "\n".join(problems)
    assert sent.get(200, 0) >= 10 and sent.get(422, 0) + sent.get(413, 0) >= 10, sent


def test_a_bad_text_batch_is_named_file_by_file_and_quarantined_while_the_champion_serves(project, service,
                                                                                        tmp_path):
    holdout = read_texts(project.root / "data/prepare/holdout.parquet")
    folder = tmp_path / "batch"
    fresh = generate_tickets(20, seed=101)
    for i, (text, label) in enumerate(zip(fresh["text"], fresh["label"])):
        (folder / label).mkdir(parents=True, exist_ok=True)
        (folder / label / f"{i}.txt").write_text(text, encoding="utf-8")
    bad = {"billing/latin1.txt": ("caf\xe9 cr\xe8me: a refund please".encode("latin-1"), "not UTF-8"),
           "billing/empty.txt": (b"", "not empty or whitespace-only"),
           "shipping/huge.txt": (b"late parcel " * 90_000, "over the limit"),
           "refunds/foreign.txt": (b"my refund never came for the broken box", "label in the class set"),
           "account/leak.txt": ((holdout[0] + " asap").encode(), "leakage across splits"),
           "technical/binary.txt": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary, not text")}
    for name, (data, _) in bad.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    refused = project.torchship("ingest", str(folder), timeout=300)
    assert refused.returncode != 0, refused.stdout[-2000:]
    said = " ".join((refused.stdout + refused.stderr).split())   # the console folds long lines
    for name, (_, rule) in bad.items():
        assert name in said and rule in said, (name, rule, said[-4000:])
    [quarantine] = [p for p in (project.root / "data/quarantine").iterdir() if p.name.endswith("texts")]
    report = json.loads((quarantine / "report.json").read_text())
    assert set(bad) <= set(report["texts_refused"])
    assert (quarantine / "files" / "billing/latin1.txt").read_bytes() == bad["billing/latin1.txt"][0]
    assert not list((project.root / "data/batches").glob("*.texts.parquet"))   # nothing joined the training data
    assert httpx.get(f"{service}/health", timeout=10).json()["champion"] == "1"
    assert httpx.post(f"{service}/predict", json={"texts": [holdout[0]]}, timeout=30).status_code == 200


def test_a_topic_shift_moves_the_descriptors_and_the_embedding_and_clean_traffic_does_not(project, monkeypatch):
    """The monitor's own measure on what the service would log of each text, against its reference."""
    from tasks.config import load_params
    from tasks.core.runtime import EMBEDDING, open_onnx
    from tasks.core.schema_spec import load_schema
    from tasks.core.servelog import PREDICTION
    from tasks.modalities import modality_of
    from tasks.modalities.text.descriptors import model_descriptors
    from tasks.modalities.text.graph import text_feed
    from tasks.modalities.text.inputs import schema_tokenizer
    from tasks.monitoring.drift import judge, measure_drift

    monkeypatch.chdir(project.root)
    params, schema = load_params(), load_schema(project.root / "data/prepare/schema.json")
    session = open_onnx(project.root / "data/profile/model.onnx", 1)
    reference = modality_of(schema).reference_frame(schema, session, 200, 0)

    def window(drift: float):
        texts = list(generate_tickets(300, seed=202, drift=drift)["text"])
        probabilities, embedding = session.run(["probabilities", EMBEDDING], text_feed(texts))
        return model_descriptors(texts, schema_tokenizer(schema)).assign(
            **{EMBEDDING: list(embedding), PREDICTION: [schema.classes[i] for i in probabilities.argmax(1)]})

    rules = params.monitor.model_copy(update={"sample_rows": 300})
    clean, _ = measure_drift(reference, window(0.0), schema, rules)
    shifted, _ = measure_drift(reference, window(1.0), schema, rules)
    assert judge(clean, rules).status != "fail", clean.features
    assert judge(shifted, rules).status == "fail", shifted.features
    assert shifted.features["oov_share"].drifted and shifted.features[EMBEDDING].drifted, shifted.features


def send(url: str, texts: list[str], labels: list[str]) -> None:
    """The texts twenty a request, then their true labels as feedback."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for start in range(0, len(texts), 20):
            answer = client.post("/predict", json={"texts": texts[start:start + 20]})
            assert answer.status_code == 200, answer.text
            ids = [prediction["id"] for prediction in answer.json()["predictions"]]
            client.post("/feedback", json={"labels": [{"id": i, "label": label} for i, label in
                                                       zip(ids, labels[start:start + 20])]})


def test_the_drift_retrain_learns_from_ingested_shifted_texts_and_the_live_canary_promotes_it(project, service,
                                                                                             tmp_path):
    """`torchship monitor` without the Prefect server (the embedded default) runs the retrain flow itself once the
    served window drifts and enough labelled texts came in."""
    labelled = generate_tickets(160, seed=404, drift=SHIFT)
    folder = tmp_path / "labelled-shifted"
    for i, (text, label) in enumerate(zip(labelled["text"], labelled["label"])):
        (folder / label).mkdir(parents=True, exist_ok=True)
        (folder / label / f"shifted-{i}.txt").write_text(text, encoding="utf-8")
    accepted = project.torchship("ingest", str(folder), timeout=300)
    assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-2000:]
    stream = generate_tickets(200, seed=505, drift=SHIFT)   # what users send now
    send(service, list(stream["text"]), list(stream["label"]))
    env = {k: v for k, v in project.env().items() if k != "PREFECT_API_URL"}
    done = subprocess.run([str(BIN / "torchship"), "monitor"], cwd=project.root, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decision = json.loads((project.root / "data/monitor/latest.json").read_text())
    assert decision["gate"]["status"] == "fail", decision["gate"]   # the served window drifted
    registry = project.registry(MODEL)
    assert set(registry["versions"]) == {"1", "2"}, (decision, registry)
    tags = registry["versions"]["2"]
    assert tags.get("approval") == WAITING, tags   # blessed, and a person approves before the canary
    assert "texts.parquet" in tags.get("data_batches", ""), tags
    approved = project.torchship("approve", "2", "--reason", "retrained on the shifted tickets", timeout=300)
    assert approved.returncode == 0, approved.stdout[-2000:] + approved.stderr[-2000:]
    request_log = project.root / "data/serve/requests.jsonl"
    holdout = project.root / "data/prepare/holdout.parquet"   # the retrain's: old tickets and shifted ones
    # users at about 40 requests a second: the canary's steps fill in a second, and no CPU goes on a flood
    with LiveTraffic(service, read_texts(holdout), read_metadata(holdout)["label"], pause_s=0.2):
        canary = project.torchship("canary", "--url", service, "--token", TOKEN, "--request-log", str(request_log),
                                   timeout=900)
    assert canary.returncode == 0, canary.stdout[-3000:] + canary.stderr[-3000:]
    assert project.registry(MODEL)["aliases"].get("champion") == "2", canary.stdout[-3000:]
