"""An image model's service (a small served graph as a model file, in memory) under the requests that stalled it: a
6,300 x 6,300 all-black PNG (a 38 KB file, 40 M pixels) alone, and a hundred of them in one body, are refused unread
(413 naming the limit and its setting); with the per-image limit raised so that it is decoded, /health is answered
while it decodes; every image body is decoded in the thread pool, at most serve.max_decodes at once; and a file
prepare accepts but the body limit refuses is told which limit applies first and what to set. The figures (time to
refusal, /health's latency during a decode, memory) are bench/bench_image_limits.py's, not asserted here."""
from __future__ import annotations

import asyncio
import base64
import io
import threading
import warnings

import httpx
import numpy as np
import pytest

from serving.app import create_app
from serving.service import ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.decode import ImageLimits, encode_png, inspect_image
from tasks.modalities.image.settings import ImagesParams
from tests.helpers.images import bomb_png, served_image_model

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

SCHEMA = Schema(source="t", target="label", classes=["a", "b", "c"], modality="image",
                inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())
HUGE = 6300
WAIT_S = 30.0   # the most the test waits for an event that should come at once (an order, not a time, is asserted)
HOST = ImagesParams()   # the serving host's image params, at their defaults
UNLIMITED = ImagesParams(serve_pixels_factor=1e6)   # the per-image serving limit raised: the huge PNG is decoded


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return served_image_model(tmp_path_factory.mktemp("image-model"), SCHEMA)


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory) -> bytes:
    return bomb_png(tmp_path_factory.mktemp("huge") / "black.png", HUGE, HUGE).read_bytes()


def app(model_file, images: ImagesParams = HOST, **serve):
    return create_app(ServiceSettings(serve=ServeParams(request_log="", **serve), model_name="m",
                                      tracking=TrackingParams(), model_file=model_file,
                                      host={"images": images.model_dump()}))


@pytest.fixture
def decodes(monkeypatch) -> list[tuple[int, int]]:
    """The size of every image Pillow decodes (ImageFile.load: what reads the pixels, not the header)."""
    from PIL import ImageFile

    sizes, load = [], ImageFile.ImageFile.load

    def counted(image):
        sizes.append(image.size)
        return load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    return sizes


def as_json(*files: bytes) -> dict:
    return {"images": [base64.b64encode(f).decode() for f in files]}


def test_the_huge_png_alone_and_a_hundred_in_one_body_are_refused_unread(model_file, huge_png, decodes):
    assert len(huge_png) < 64 << 10   # small enough to have been decoded on the event loop
    hundred = [("image", (f"{i}.png", huge_png, "image/png")) for i in range(100)]
    with TestClient(app(model_file)) as client:
        alone = client.post("/predict", json=as_json(huge_png))
        assert alone.status_code == 413, alone.text[:300]
        assert "images.serve_pixels_factor" in alone.json()["detail"] and "not decoded" in alone.json()["detail"]
        many = client.post("/predict", files=hundred)   # under the 4 MiB body limit
        assert many.status_code == 413 and "images.serve_pixels_factor" in many.json()["detail"]
    with TestClient(app(model_file, UNLIMITED)) as client:   # each alone would be decoded: together, over budget
        many = client.post("/predict", files=hundred)
        assert many.status_code == 413 and "images.max_request_pixels" in many.json()["detail"]
    assert (HUGE, HUGE) not in decodes


def test_health_is_answered_while_an_image_decodes(model_file, huge_png, monkeypatch):
    from PIL import ImageFile

    decoding, release, decoded = threading.Event(), threading.Event(), threading.Event()
    load = ImageFile.ImageFile.load

    def held(image):   # the huge image's decode starts, then waits for the test (or WAIT_S) before it reads on
        if image.size != (HUGE, HUGE):
            return load(image)
        decoding.set()
        release.wait(WAIT_S)
        try:
            return load(image)
        finally:
            decoded.set()

    monkeypatch.setattr(ImageFile.ImageFile, "load", held)
    front = app(model_file, UNLIMITED)

    async def requests() -> tuple:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://service") as client:
            predict = asyncio.create_task(client.post("/predict", json=as_json(huge_png)))
            began = await asyncio.to_thread(decoding.wait, WAIT_S)
            health = await client.get("/health")
            decode_running = not decoded.is_set()
            release.set()
            return began, health.status_code, decode_running, (await predict).status_code

    with TestClient(front):   # its lifespan loads the model; the requests run on a loop of their own
        began, health, decode_running, answered = asyncio.run(requests())
    assert began and health == 200
    assert decode_running, "/health waited for the decode: it ran on the event loop"
    assert answered == 200   # the raised limit let it through, decoded


def test_every_image_body_is_decoded_in_the_thread_pool_at_most_max_decodes_at_once(model_file, monkeypatch):
    import serving.front

    inside, peak, two_inside, release = [0], [0], threading.Event(), threading.Event()
    run = serving.front.run_in_threadpool

    async def counted(work, *args):
        inside[0] += 1
        peak[0] = max(peak[0], inside[0])
        if inside[0] >= 2:
            two_inside.set()
        try:
            await asyncio.to_thread(release.wait, WAIT_S)
            return await run(work, *args)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(serving.front, "run_in_threadpool", counted)
    front = app(model_file, max_decodes=2, batch=True)
    small = encode_png(np.full((16, 16, 3), 90, np.uint8))   # a few hundred bytes

    async def requests() -> tuple[int, list[int]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://service") as client:
            posts = [asyncio.create_task(client.post("/predict", json=as_json(small))) for _ in range(6)]
            await asyncio.to_thread(two_inside.wait, WAIT_S)
            for _ in range(200):   # turns of the loop: every request reaches its decode's door
                await asyncio.sleep(0)
            held = inside[0]
            release.set()
            return held, [(await post).status_code for post in posts]

    with TestClient(front):
        held, statuses = asyncio.run(requests())
    assert statuses == [200] * 6
    assert held == 2 and peak[0] == 2   # the others waited their turn (on the loop, holding no thread)


def test_a_file_prepare_accepts_is_told_which_limit_refuses_it_first(model_file):
    from PIL import Image, PngImagePlugin

    note = PngImagePlugin.PngInfo()
    note.add(b"prVt", np.random.default_rng(0).bytes(5 << 20))   # a 5 MiB private chunk: a big file, 16x16 pixels
    buffer = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 120, np.uint8)).save(buffer, format="PNG", pnginfo=note)
    data = buffer.getvalue()
    assert inspect_image("big.png", data, ImageLimits()).decodable   # within prepare's images.max_file_mb
    upload = [("image", ("big.png", data, "image/png"))]
    with TestClient(app(model_file)) as client:
        refused = client.post("/predict", files=upload)
    detail = refused.json()["detail"]
    assert refused.status_code == 413 and "serve.max_body_mb" in detail and "images.max_file_mb" in detail
    with TestClient(app(model_file, max_body_mb=8.0)) as client:   # what the refusal says to set
        assert client.post("/predict", files=upload).status_code == 200
