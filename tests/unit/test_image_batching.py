"""Micro-batching of image requests in the service (serving/batching.py over tasks/modalities/image/serving.py
ImageRows): requests
that arrive together, through the whole ASGI app on one event loop, are scored in fewer graph runs than there are
requests, and each answer holds exactly its own images' probabilities, as the graph gives them scored alone."""
from __future__ import annotations

import asyncio
import base64
import warnings

import httpx
import numpy as np
import orjson
import pytest

from serving.app import create_app
from serving.service import ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.runtime import open_onnx
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.decode import encode_png
from tests.helpers.images import served_image_model

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

SCHEMA = Schema(source="t", target="label", classes=["a", "b", "c", "d"], modality="image",
                inputs=ImageShape(height=12, width=12, channels=3, mode="RGB").model_dump())
REQUESTS = 12


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return served_image_model(tmp_path_factory.mktemp("image-model"), SCHEMA)


def png(seed: int) -> bytes:
    return encode_png(np.random.default_rng(seed).integers(0, 256, (12, 12, 3), dtype=np.uint8))


def alone(model_file, files: list[bytes]) -> np.ndarray:
    """(N, C): the served graph's probabilities of each image, one run per image."""
    from tasks.modalities.image.decode import ImageLimits
    from tasks.modalities.image.serving import ImageDecoder

    decoder, session = ImageDecoder(SCHEMA, ImageLimits()), open_onnx(model_file, 1)
    return np.concatenate([session.run(["probabilities"], decoder.feed(decoder.decode(
        orjson.dumps({"images": [base64.b64encode(f).decode()]}))))[0] for f in files])


async def send_together(front, bodies: list[list[bytes]]) -> list[httpx.Response]:
    """Every body posted at once on this event loop: JSON base64 and multipart uploads alternately."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://service") as client:
        def post(index: int, files: list[bytes]):
            if index % 2:
                return client.post("/predict", files=[("image", (f"{i}.png", f, "image/png"))
                                                      for i, f in enumerate(files)])
            return client.post("/predict", json={"images": [base64.b64encode(f).decode() for f in files]})

        return await asyncio.gather(*(post(i, files) for i, files in enumerate(bodies)))


@pytest.mark.parametrize("wait_ms", [0.0, 20.0])
def test_concurrent_image_requests_share_graph_runs_and_get_their_own_answers(model_file, wait_ms):
    serve = ServeParams(request_log="", batch=True, batch_max_rows=64, batch_wait_ms=wait_ms)
    front = create_app(ServiceSettings(serve=serve, model_name="m", tracking=TrackingParams(), model_file=model_file))
    bodies = [[png(10 * r + i) for i in range(1 + r % 3)] for r in range(REQUESTS)]   # 1 to 3 images each
    with TestClient(front):   # its lifespan loads the model; the requests below run on a loop of their own
        responses = asyncio.run(send_together(front, bodies))
    assert [r.status_code for r in responses] == [200] * REQUESTS, [r.text for r in responses]
    batcher = front.batcher
    assert batcher.rows == sum(map(len, bodies)) and batcher.batches < REQUESTS   # fewer graph runs than requests
    for response, files in zip(responses, bodies):
        predictions = response.json()["predictions"]
        got = np.array([[p["probabilities"][c] for c in SCHEMA.classes] for p in predictions])
        np.testing.assert_allclose(got, alone(model_file, files), rtol=1e-5, atol=1e-6)


def test_a_batch_never_grows_past_its_row_limit(model_file, monkeypatch):
    from serving.batching import Batch

    sizes, score = [], Batch.score

    def counted(batch: Batch) -> None:
        sizes.append(len(batch.rows))
        score(batch)

    monkeypatch.setattr(Batch, "score", counted)
    serve = ServeParams(request_log="", batch=True, batch_max_rows=4, batch_wait_ms=20.0)
    front = create_app(ServiceSettings(serve=serve, model_name="m", tracking=TrackingParams(), model_file=model_file))
    with TestClient(front):
        responses = asyncio.run(send_together(front, [[png(r)] for r in range(REQUESTS)]))
    assert all(r.status_code == 200 for r in responses)
    assert sum(sizes) == REQUESTS and max(sizes) <= 4 and len(sizes) == front.batcher.batches < REQUESTS
