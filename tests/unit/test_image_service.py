"""The service on an image model (a served graph of a small ResNet as a model file, FastAPI's TestClient, lifespan
included): a PNG upload and a base64 body answer the graph's own probabilities, limits get 413 and broken images 422
(never a 5xx), the OpenAPI document shows both bodies, and the request log keeps an image's statistics and
embedding, never its pixels; batch scoring a folder answers as the service does. Concurrent requests sharing one
graph run: tests/unit/test_image_batching.py."""
from __future__ import annotations

import base64
import warnings

import numpy as np
import onnx
import orjson
import pytest
import torch

from models.cnn import ImageLayout, ImageResNet
from serving.app import create_app
from serving.service import Service, ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.runtime import open_onnx
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.decode import encode_png
from tasks.modalities.image.graph import compose_image_model
from tasks.modalities.image.settings import ImagesParams
from tasks.variants.exporters import export_onnx
from tests.helpers.images import bomb_png

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

SCHEMA = Schema(source="t", target="label", classes=["circle", "cross", "square"], modality="image",
                inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("image-model")
    model = ImageResNet(ImageLayout(16, 16, 3, [0.4] * 3, [0.25] * 3, 3), widths=[8, 16]).eval()
    export_onnx(model, SCHEMA, "legacy", folder / "bare.onnx")
    onnx.save(compose_image_model(onnx.load(str(folder / "bare.onnx")), SCHEMA), folder / "model.onnx")
    return folder / "model.onnx"


@pytest.fixture(scope="module")
def client(model_file):
    settings = ServiceSettings(serve=ServeParams(request_log="", max_body_mb=1.0), model_name="m",
                               tracking=TrackingParams(), model_file=model_file,
                               host={"images": ImagesParams(max_pixels=2_000_000, max_file_mb=0.5).model_dump()})
    with TestClient(create_app(settings)) as client:
        yield client


def image(seed: int, size: tuple[int, int] = (16, 16), channels: int = 3) -> bytes:
    return encode_png(np.random.default_rng(seed).integers(0, 256, (*size, channels), dtype=np.uint8))


def graph_probabilities(model_file, files: list[bytes]) -> np.ndarray:
    from tasks.modalities.image.decode import ImageLimits
    from tasks.modalities.image.serving import ImageDecoder

    decoder = ImageDecoder(SCHEMA, ImageLimits())
    pixels = decoder.feed(decoder.decode(orjson.dumps({"images": [base64.b64encode(f).decode() for f in files]})))
    return open_onnx(model_file, 1).run(["probabilities"], pixels)[0]


def test_an_upload_and_a_base64_body_answer_the_graphs_probabilities(client, model_file):
    files = [image(1), image(2, (30, 24))]
    uploaded = client.post("/predict", files=[("image", ("a.png", files[0], "image/png")),
                                              ("image", ("b.png", files[1], "image/png"))])
    encoded = client.post("/predict", json={"images": [base64.b64encode(f).decode() for f in files]})
    assert uploaded.status_code == encoded.status_code == 200, (uploaded.text, encoded.text)
    expected = graph_probabilities(model_file, files)
    for response in (uploaded, encoded):
        predictions = response.json()["predictions"]
        got = np.array([[p["probabilities"][c] for c in SCHEMA.classes] for p in predictions])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        assert [p["label"] for p in predictions] == [SCHEMA.classes[i] for i in expected.argmax(1)]


def test_limits_are_413_and_broken_images_422_never_5xx(client, tmp_path):
    bomb = bomb_png(tmp_path / "bomb.png", 3000, 3000).read_bytes()   # 9 M pixels: over 2 M, a small file
    cases = [
        (dict(files=[("image", ("b.png", bomb, "image/png"))]), 413),
        (dict(content=b"x" * (2 << 20), headers={"content-type": "application/json"}), 413),
        (dict(files=[("image", ("t.png", b"plain text, named .png", "image/png"))]), 422),
        (dict(files=[("image", ("tiny.png", image(3, (2, 2)), "image/png"))]), 422),
        (dict(files=[("file", ("a.png", image(4), "image/png"))]), 422),
        (dict(json={"images": ["not base64!"]}), 422),
        (dict(json={"rows": [{"a": 1}]}), 422),
        (dict(content=b"{", headers={"content-type": "application/json"}), 400),
    ]
    for request, status in cases:
        response = client.post("/predict", **request)
        assert response.status_code == status, (request, response.text)
        assert response.json()["request_id"]


def test_a_grayscale_upload_to_a_colour_model_is_read_as_colour(client):
    response = client.post("/predict", files=[("image", ("g.png", image(5, channels=1), "image/png"))])
    assert response.status_code == 200, response.text


def test_openapi_documents_both_bodies(client):
    operation = client.get("/openapi.json").json()["paths"]["/predict"]["post"]
    content = operation["requestBody"]["content"]
    assert set(content) == {"application/json", "multipart/form-data"}
    assert content["application/json"]["schema"]["properties"]["images"]["items"]["format"] == "byte"
    assert "16x16 RGB" in operation["description"] and "413" in operation["responses"]


def test_the_log_line_keeps_statistics_and_the_embedding_not_pixels(model_file):
    settings = ServiceSettings(serve=ServeParams(request_log=""), model_name="m", tracking=TrackingParams(),
                               model_file=model_file)
    service = Service(settings)
    service.start()
    try:
        accepted = service.accept(orjson.dumps({"images": [base64.b64encode(image(6)).decode()]}))
        scores = accepted.variant.score(accepted.rows)
        line = orjson.loads(Service._served_lines("r", accepted.variant, accepted.rows, scores))
    finally:
        service.stop()
    features = line["features"]
    assert set(features) == {"width", "height", "mode", "file_bytes", "brightness", "contrast", "sha256", "embedding"}
    assert len(features["embedding"]) == 16 and len(orjson.dumps(line)) < 2000   # no pixels in it
    assert sorted(line["probabilities"]) == sorted(SCHEMA.classes)


def test_batch_scoring_a_folder_answers_as_the_service_and_refuses_whole(model_file, tmp_path):
    from serving.variants import file_variant
    from tasks.core.scored_files import FileRefused
    from tasks.modalities.image.batch import predict_images

    variant = file_variant("champion", model_file, 1)
    folder = tmp_path / "images"
    (folder / "circle").mkdir(parents=True)
    files = [image(10 + i) for i in range(5)]
    for i, data in enumerate(files):
        (folder / "circle" / f"{i}.png").write_bytes(data)
    output = tmp_path / "out.parquet"
    summary = predict_images(folder, output, variant, chunk=2, show_progress=False)
    import pandas as pd

    scored = pd.read_parquet(output)
    assert summary.rows == 5 and summary.chunks == 3 and list(scored["label"]) == ["circle"] * 5
    np.testing.assert_allclose(scored[[f"probability_{c}" for c in SCHEMA.classes]].to_numpy(),
                               graph_probabilities(model_file, files), rtol=1e-5, atol=1e-7)
    (folder / "circle" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(FileRefused, match="broken.png"):
        predict_images(folder, tmp_path / "again.csv", variant, show_progress=False)
    assert not (tmp_path / "again.csv").exists()
    assert "broken.png" in (tmp_path / "again.csv.problems.csv").read_text()
