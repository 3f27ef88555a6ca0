"""The service on a text model (a served graph of a small bag-of-n-grams model over its own tokenizer, as a model file;
FastAPI's TestClient, lifespan included): raw strings answer the graph's own probabilities, the adversarial ones
included; limits get 413, an empty list, a lone surrogate and other shapes 422, never a 5xx; the OpenAPI document
shows the body; the request log keeps descriptors and the embedding, the text only where the host opts in; batch
scoring a table and a folder answers as the service does, and refuses a file whole."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import orjson
import pandas as pd
import pytest
import torch

from models.text import TextBag, TextLayout
from serving.app import create_app
from serving.service import Service, ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.runtime import open_onnx
from tasks.core.schema_spec import Schema
from tasks.modalities.text.gate import ADVERSARIAL
from tasks.modalities.text.generated import CLASSES, generate_tickets
from tasks.modalities.text.graph import compose_text_model, text_feed
from tasks.modalities.text.inputs import text_inputs
from tasks.modalities.text.settings import TextParams
from tasks.modalities.text.tokenizer import fit_tokenizer
from tasks.variants.exporters import export_onnx

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TICKETS = generate_tickets(240, seed=5)
HOST = TextParams(max_texts=4, max_chars=400)   # the host tightens the model's 20,000 characters a text


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Schema, object]:
    """(schema, model file): a bag model with wide random weights (answers far from uniform) behind the tokenizer
    fitted on 200 tickets, exported as the export stage does and composed as profile does."""
    folder = tmp_path_factory.mktemp("text-model")
    tokenizer = fit_tokenizer(TICKETS["text"][:200], max_tokens=32)
    schema = Schema(source="t", target="label", classes=sorted(CLASSES), modality="text",
                    inputs=text_inputs(tokenizer, "text", 20_000))
    torch.manual_seed(0)
    model = TextBag(TextLayout(tokenizer.vocab_size, 32, len(CLASSES)), dim=16, buckets=64).eval()
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=2.0)
    export_onnx(model, schema, "legacy", folder / "bare.onnx")
    onnx.save(compose_text_model(onnx.load(str(folder / "bare.onnx")), schema, tokenizer), folder / "model.onnx")
    return schema, folder / "model.onnx"


def settings(model_file, host: TextParams = HOST) -> ServiceSettings:
    return ServiceSettings(serve=ServeParams(request_log="", max_body_mb=0.5), model_name="m",
                           tracking=TrackingParams(), model_file=model_file, host={"text": host.model_dump()})


@pytest.fixture(scope="module")
def client(served):
    with TestClient(create_app(settings(served[1]))) as client:
        yield client


def graph_probabilities(model_file, texts: list[str]) -> np.ndarray:
    return open_onnx(model_file, 1).run(["probabilities"], text_feed(texts))[0]


def test_raw_strings_answer_the_graphs_probabilities_adversarial_ones_included(client, served):
    schema, model_file = served
    texts = list(TICKETS["text"][200:204]) + [t for t in ADVERSARIAL if len(t) <= HOST.max_chars]
    got, labels = [], []
    for start in range(0, len(texts), HOST.max_texts):
        response = client.post("/predict", json={"texts": texts[start:start + HOST.max_texts]})
        assert response.status_code == 200, response.text
        got += [[p["probabilities"][c] for c in schema.classes] for p in response.json()["predictions"]]
        labels += [p["label"] for p in response.json()["predictions"]]
    expected = graph_probabilities(model_file, texts)
    np.testing.assert_allclose(np.array(got), expected, rtol=0, atol=1e-6)
    assert expected.max(axis=1).mean() > 0.6   # far from uniform: the comparison means something
    assert labels == [schema.classes[i] for i in expected.argmax(1)]


def test_limits_are_413_and_other_bodies_422_or_400_never_5xx(client):
    cases = [
        (dict(json={"texts": []}), 422),                                       # StringNormalizer refuses no rows
        (dict(content=b'{"texts": ["fine", "\\ud800 lone"]}'), 422),             # valid JSON, no Unicode text
        (dict(json={"texts": ["a"] * (HOST.max_texts + 1)}), 413),
        (dict(json={"texts": ["a" * (HOST.max_chars + 1)]}), 413),
        (dict(content=b"x" * (1 << 20)), 413),                                 # over serve.max_body_mb
        (dict(json={"rows": [{"text": "a"}]}), 422),
        (dict(json={"texts": "one text, not a list"}), 422),
        (dict(json={"texts": [1, 2]}), 422),
        (dict(json={"texts": ["a"], "extra": 1}), 422),
        (dict(content=b"{"), 400),
        (dict(content=b'{"texts": ["caf\xe9"]}'), 400),                         # the body is not UTF-8
    ]
    for request, status in cases:
        response = client.post("/predict", headers={"content-type": "application/json"}, **request)
        assert response.status_code == status, (request, response.text)
        assert response.json()["request_id"] and response.json()["detail"]
    refused = client.post("/predict", content=b'{"texts": ["fine", "\\ud800 lone"]}').json()["detail"]
    assert refused == [{"row": 1, "field": "text", "rule": "unicode",
                        "message": "a lone surrogate U+D800 at character 0: not Unicode text"}]


def test_openapi_documents_the_texts_body_and_its_limits(client):
    operation = client.get("/openapi.json").json()["paths"]["/predict"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["texts"] and body["properties"]["texts"]["maxItems"] == HOST.max_texts
    assert body["properties"]["texts"]["items"]["maxLength"] == HOST.max_chars
    assert "tokenized inside the served graph" in operation["description"] and "413" in operation["responses"]


def logged(model_file, host: TextParams, text: str) -> dict:
    service = Service(settings(model_file, host))
    service.start()
    try:
        accepted = service.accept(orjson.dumps({"texts": [text]}))
        scores = accepted.variant.score(accepted.rows)
        return orjson.loads(Service._served_lines("r", accepted.variant, accepted.rows, scores))
    finally:
        service.stop()


def test_the_log_keeps_descriptors_and_the_embedding_and_the_text_only_when_opted_in(served):
    text = "my parcel never came, ZZZQQQ"
    features = logged(served[1], HOST, text)["features"]
    assert set(features) == {"chars", "words", "non_letter_share", "oov_share", "embedding"}
    assert features["chars"] == len(text) and features["words"] == 5 and len(features["embedding"]) == 16
    assert 0 < features["oov_share"] < 1   # "zzzqqq" is no word of the tokenizer's vocabulary
    assert text not in orjson.dumps(features).decode()
    opted = logged(served[1], HOST.model_copy(update={"log_raw": True}), text)["features"]
    assert opted["text"] == text


def test_batch_scoring_a_table_and_a_folder_answers_as_the_service_and_refuses_whole(served, tmp_path):
    from serving.variants import file_variant
    from tasks.core.scored_files import FileRefused
    from tasks.modalities.text.batch import predict_texts

    schema, model_file = served
    variant = file_variant("champion", model_file, 1, host={"text": HOST.model_dump()})
    texts = list(TICKETS["text"][200:207])
    pd.DataFrame({"body": texts, "label": ["billing"] * 7}).to_csv(tmp_path / "in.csv", index=False)
    summary = predict_texts(tmp_path / "in.csv", tmp_path / "out.parquet", variant, "body", "label", chunk=3,
                            show_progress=False)
    scored = pd.read_parquet(tmp_path / "out.parquet")
    assert summary.rows == 7 and summary.chunks == 3 and list(scored["label"]) == ["billing"] * 7
    np.testing.assert_allclose(scored[[f"probability_{c}" for c in schema.classes]].to_numpy(),
                               graph_probabilities(model_file, texts), rtol=0, atol=1e-6)
    folder = tmp_path / "texts"
    (folder / "shipping").mkdir(parents=True)
    for i, text in enumerate(texts[:3]):
        (folder / "shipping" / f"{i}.txt").write_text(text, encoding="utf-8")
    assert predict_texts(folder, tmp_path / "folder.csv", variant, "text", show_progress=False).rows == 3
    assert set(pd.read_csv(tmp_path / "folder.csv")["name"]) == {"shipping/0.txt", "shipping/1.txt", "shipping/2.txt"}
    (folder / "shipping" / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(FileRefused, match="latin1.txt"):
        predict_texts(folder, tmp_path / "again.csv", variant, "text", show_progress=False)
    assert not (tmp_path / "again.csv").exists()
    assert "not UTF-8" in (tmp_path / "again.csv.problems.csv").read_text()


def test_the_raw_parity_gate_passes_the_served_graph_and_refuses_one_with_a_wrong_tokenizer(served):
    """The profile stage's gate (Text.raw_parity): tokenization first, on the graph's own front end."""
    import dataclasses

    from tasks.core.params_spec import ExportParams
    from tasks.modalities import modality_of
    from tasks.modalities.interface import Holdout
    from tasks.modalities.text.inputs import schema_tokenizer

    schema, model_file = served
    bare = onnx.load(str(model_file.with_name("bare.onnx")))
    texts = list(TICKETS["text"][200:])
    holdout = Holdout(TICKETS.iloc[200:], np.zeros((len(texts), 32), np.int64), text_feed(texts),
                      np.zeros(len(texts), np.int64))
    tokenizer, modality = schema_tokenizer(schema), modality_of(schema)
    shifted = dataclasses.replace(tokenizer, vocabulary=tokenizer.vocabulary[1:] + tokenizer.vocabulary[:1])
    right = modality.compose(bare, schema).SerializeToString()
    wrong = compose_text_model(bare, schema, shifted).SerializeToString()
    rules = ExportParams()
    passed = modality.raw_parity("onnx", open_onnx(model_file.with_name("bare.onnx"), 1), open_onnx(right, 1),
                                 schema, holdout, rules, right)
    assert passed.status == "pass" and "the served graph's own front end" in passed.reasons[0], passed.reasons
    refused = modality.raw_parity("onnx", open_onnx(model_file.with_name("bare.onnx"), 1), open_onnx(wrong, 1),
                                  schema, holdout, rules, wrong)
    assert refused.status == "fail" and refused.reasons[0].startswith("tokenization gate"), refused.reasons
