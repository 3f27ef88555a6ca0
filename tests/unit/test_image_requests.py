"""The service's image request decoder (tasks/modalities/image/serving.py): JSON base64 and multipart uploads, limits
answered 413,
broken images 422 naming the image and the rule, every accepted image brought to the model's size and mode."""
from __future__ import annotations

import base64
import io

import numpy as np
import orjson
import pytest

from tasks.core.refusals import BodyRefused, RowsRefused
from tasks.core.schema_spec import ImageShape, Schema
from tasks.modalities.image.decode import ImageLimits, encode_png
from tasks.modalities.image.serving import ImageDecoder
from tests.helpers.images import bomb_png

SCHEMA = Schema(source="t", target="label", classes=["a", "b"], modality="image",
                image=ImageShape(height=16, width=16, channels=3, mode="RGB"))
DECODER = ImageDecoder(SCHEMA, ImageLimits(max_file_bytes=1 << 20, max_pixels=1_000_000), min_side=4)


def png(height: int = 16, width: int = 16, channels: int = 3, value: int | None = None) -> bytes:
    rng = np.random.default_rng(height * width)
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8) if value is None else \
        np.full((height, width, channels), value, np.uint8)
    return encode_png(pixels)


def as_json(*files: bytes) -> bytes:
    return orjson.dumps({"images": [base64.b64encode(f).decode() for f in files]})


def multipart(*parts: tuple[str, bytes]) -> tuple[bytes, str]:
    boundary = "torchship-test-boundary"
    body = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"f.png\"\r\n"
                    f"Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n" for name, data in parts)
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_json_and_multipart_give_the_same_pixels():
    first, second = png(), png(24, 20)
    from_json = DECODER.decode(as_json(first, second))
    body, content_type = multipart(("image", first), ("image", second))
    from_upload = DECODER.decode(body, content_type)
    assert len(from_json) == len(from_upload) == 2
    for a, b in zip(from_json.pixels, from_upload.pixels):
        np.testing.assert_array_equal(a, b)
    assert DECODER.feed(from_json)["image"].shape == (2, 16, 16, 3)
    assert from_json.stats[1]["width"] == 20 and from_json.stats[1]["height"] == 24


def test_a_data_url_prefix_is_accepted_and_gray_is_read_as_colour():
    gray = png(channels=1, value=90)
    body = orjson.dumps({"images": ["data:image/png;base64," + base64.b64encode(gray).decode()]})
    rows = DECODER.decode(body)
    assert rows.pixels[0].shape == (16, 16, 3) and int(rows.pixels[0].mean()) == 90


def test_the_log_keeps_statistics_not_pixels():
    rows = DECODER.decode(as_json(png(value=200)))
    logged = DECODER.features(rows, 0)
    assert logged["brightness"] == 200.0 and logged["contrast"] == 0.0
    assert all(not isinstance(v, (bytes, np.ndarray)) for v in logged.values())


@pytest.mark.parametrize("files, status", [
    ((b"x" * (2 << 20),), 413),                     # over the byte limit: not read
    ((b"\x89PNG\r\n\x1a\n" + bytes(100),), 422),    # not decodable
])
def test_limits_and_broken_files(files, status):
    with pytest.raises((BodyRefused, RowsRefused)) as refusal:
        DECODER.decode(as_json(*files))
    got = refusal.value.status if isinstance(refusal.value, BodyRefused) else 422
    assert got == status


def test_a_decompression_bomb_is_refused_unread(tmp_path):
    bomb = bomb_png(tmp_path / "bomb.png", 4000, 4000).read_bytes()   # 16 M pixels, a small file
    with pytest.raises(BodyRefused) as refusal:
        DECODER.decode(as_json(bomb))
    assert refusal.value.status == 413 and "pixels" in refusal.value.detail


def test_every_broken_image_is_named_with_its_rule():
    with pytest.raises(RowsRefused) as refusal:
        DECODER.decode(as_json(png(), b"not an image", png(2, 2)))
    problems = {p["row"]: p["rule"] for p in refusal.value.problems}
    assert problems == {1: "decodable", 2: "min_side"}


@pytest.mark.parametrize("body, content_type, status", [
    (b"{not json", None, 400),
    (b'{"rows": []}', None, 422),
    (b'{"images": []}', None, 422),
    (b'{"images": ["%%%"]}', None, 422),
])
def test_malformed_bodies(body, content_type, status):
    with pytest.raises((BodyRefused, RowsRefused)) as refusal:
        DECODER.decode(body, content_type)
    assert (refusal.value.status if isinstance(refusal.value, BodyRefused) else 422) == status


def test_an_upload_without_image_parts_is_refused_naming_the_parts():
    body, content_type = multipart(("file", png()))
    with pytest.raises(BodyRefused) as refusal:
        DECODER.decode(body, content_type)
    assert refusal.value.status == 422 and "file" in refusal.value.detail


def test_a_jpeg_is_read_too():
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((30, 40, 3), 120, np.uint8)).save(buffer, format="JPEG")
    rows = DECODER.decode(as_json(buffer.getvalue()))
    assert rows.pixels[0].shape == (16, 16, 3)
