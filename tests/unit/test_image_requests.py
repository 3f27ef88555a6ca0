"""The service's image request decoder (tasks/modalities/image/serving.py): JSON base64 (line-wrapped too) and
multipart uploads (parts capped), limits answered 413 (the model's own, which the host only tightens), broken images
422 naming the image and the rule, every accepted image brought to the model's size and mode; and the one reading of
a file every reader shares (tasks/modalities/image/decode.py): 16-bit scaled, MPO read as JPEG, EXIF orientation
applied, an animated file's first frame."""
from __future__ import annotations

import base64
import io
import textwrap
import time

import numpy as np
import orjson
import pytest

from tasks.core.refusals import BodyRefused, RowsRefused
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape, ReadLimits
from tasks.modalities.image.decode import ImageLimits, encode_png, inspect_image
from tasks.modalities.image.serving import ImageDecoder
from tasks.modalities.image.settings import ImagesParams
from tests.helpers.image_kinds import image_file, png_16bit, saved
from tests.helpers.images import bomb_png

SCHEMA = Schema(source="t", target="label", classes=["a", "b"], modality="image",
                inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())
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


def read(data: bytes):
    """The pipeline's one reading of a file (prepare, ingest, batch scoring), in its own mode."""
    return inspect_image("f", data, ImageLimits())


def test_a_16_bit_png_is_scaled_to_8_bits_not_clipped():
    ramp = np.linspace(0, 65535, 64 * 16).round().astype(np.uint16).reshape(16, 64)   # the full 16-bit range
    for levels in (ramp, np.stack([ramp] * 3, axis=2)):
        found = read(png_16bit(levels))
        assert found.decodable, found.error
        assert found.pixels.min() == 0 and found.pixels.max() == 255
        assert found.brightness == pytest.approx(127.5, abs=1.0)   # clipped, it read as almost all white
        np.testing.assert_allclose(found.pixels[..., 0], levels[..., 0] / 257 if levels.ndim == 3 else ramp / 257,
                                   atol=1.0)
    rows = DECODER.decode(as_json(png_16bit(ramp)))   # the service reads it the same way
    assert rows.stats[0]["brightness"] == pytest.approx(127.5, abs=1.0)


def test_a_multi_picture_jpeg_is_read_as_a_jpeg_by_its_first_picture():
    from PIL import Image

    first, second = Image.new("RGB", (40, 30), (20, 60, 200)), Image.new("RGB", (40, 30), (230, 10, 10))
    data = saved(first, "MPO", save_all=True, append_images=[second])
    assert Image.open(io.BytesIO(data)).format == "MPO"
    found = read(data)
    assert found.decodable and found.format == "JPEG", found.error
    np.testing.assert_allclose(found.pixels.reshape(-1, 3).mean(axis=0), (20, 60, 200), atol=3)
    assert DECODER.decode(as_json(data)).stats[0]["width"] == 40


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_a_browser_shows_the_image(orientation):
    from PIL import Image, ImageOps

    data = image_file("png-exif", 20, 40, orientation=orientation)   # lossless, so the pixels compare exactly
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    found = read(data)
    np.testing.assert_array_equal(found.pixels, upright)
    assert (found.height, found.width) == upright.shape[:2]
    jpeg = DECODER.decode(as_json(image_file("jpeg-exif", 20, 40, orientation=orientation)))
    assert (jpeg.stats[0]["height"], jpeg.stats[0]["width"]) == ((40, 20) if orientation >= 5 else (20, 40))


def test_an_animated_png_is_read_by_its_first_frame_and_a_gif_is_refused_by_name():
    from PIL import Image

    data = saved(Image.new("RGB", (16, 16), (0, 0, 250)), "PNG", save_all=True,
                 append_images=[Image.new("RGB", (16, 16), (250, 0, 0))])
    assert Image.open(io.BytesIO(data)).n_frames == 2
    assert read(data).pixels.reshape(-1, 3).mean(axis=0).tolist() == [0, 0, 250]
    with pytest.raises(RowsRefused) as refusal:
        DECODER.decode(as_json(image_file("gif")))
    assert refusal.value.problems[0]["rule"] == "decodable" and "GIF" in refusal.value.problems[0]["message"]


def test_twenty_thousand_empty_parts_are_refused_at_the_part_limit_with_a_short_message():
    body, content_type = multipart(*[(f"part{i}", b"") for i in range(20_000)])
    started = time.process_time()
    with pytest.raises(BodyRefused) as refusal:
        DECODER.decode(body, content_type)
    assert time.process_time() - started < 2.0   # generous: the standard library's parser took seconds
    assert refusal.value.status == 413 and "images.max_parts" in refusal.value.detail
    assert len(refusal.value.detail) < 400 and "part19999" not in refusal.value.detail


def test_an_upload_of_other_parts_names_a_few_of_them_not_all():
    body, content_type = multipart(*[(f"field{i}", b"x") for i in range(100)])
    with pytest.raises(BodyRefused) as refusal:
        DECODER.decode(body, content_type)
    assert refusal.value.status == 422 and "field0" in refusal.value.detail and "field99" not in refusal.value.detail


def test_a_part_over_the_file_limit_is_refused_before_the_rest_is_read():
    body, content_type = multipart(("image", b"x" * (2 << 20)), ("image", png()))
    with pytest.raises(BodyRefused) as refusal:
        DECODER.decode(body, content_type)
    assert refusal.value.status == 413 and "images.max_file_mb" in refusal.value.detail


@pytest.mark.parametrize("content_type", ["Multipart/Form-Data", "MULTIPART/FORM-DATA", " multipart/form-data"])
def test_a_multipart_content_type_is_read_in_any_case(content_type):
    body, given = multipart(("image", png()), ("image", png(20, 20)))
    rows = DECODER.decode(body, given.replace("multipart/form-data", content_type))
    assert len(rows) == 2


def test_line_wrapped_base64_is_read():
    encoded = base64.b64encode(png(40, 40)).decode()
    wrapped = "\n".join(textwrap.wrap(encoded, 76)) + "\n"   # as GNU base64 writes it
    assert "\n" in wrapped.strip()
    rows = DECODER.decode(orjson.dumps({"images": [wrapped, "data:image/png;base64," + wrapped.replace("\n", "\r\n")]}))
    np.testing.assert_array_equal(rows.pixels[0], DECODER.decode(as_json(png(40, 40))).pixels[0])
    assert len(rows) == 2


def test_the_limits_are_the_models_own_and_the_host_only_tightens_them():
    from serving.variants import decoder_for

    trained = ImageShape(height=16, width=16, channels=3, mode="RGB",
                         limits=ReadLimits(max_file_bytes=1500, max_pixels=5_000, min_side=6))
    schema = Schema(source="t", target="label", classes=["a", "b"], modality="image", inputs=trained.model_dump())
    small, larger = png(8, 8), png(40, 40)   # 1,600 pixels: within the model's pixels, over its bytes
    assert 200 < len(small) < 1500 < len(larger)
    served = decoder_for(schema, {"images": ImagesParams()})   # the host's defaults are looser: the model's own apply
    with pytest.raises(BodyRefused) as refusal:
        served.decode(as_json(larger))
    assert refusal.value.status == 413 and "training" in refusal.value.detail
    with pytest.raises(RowsRefused) as refusal:   # 5 pixels: over the host's min_side (4), under the model's (6)
        served.decode(as_json(png(5, 5)))
    assert refusal.value.problems[0]["rule"] == "min_side"
    assert len(served.decode(as_json(small))) == 1
    tighter = decoder_for(schema, {"images": ImagesParams(max_file_mb=200 / (1 << 20), max_pixels=50)})   # tightened
    with pytest.raises(BodyRefused) as refusal:
        tighter.decode(as_json(small))
    assert "images.max_file_mb" in refusal.value.detail
    older = Schema(source="t", target="label", classes=["a", "b"], modality="image",
                   inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())   # before it had limits
    assert len(decoder_for(older, {"images": ImagesParams()}).decode(as_json(larger))) == 1   # the host's params apply


def test_batch_scoring_reads_a_large_image_as_the_service_does():
    from tasks.modalities.image.batch import read_one
    from tasks.modalities.image.sources import ImageFile

    data = image_file("jpeg", 300, 400, seed=3)   # far over the model's size: reduced before it is converted
    pixels, stats, rule = read_one(ImageFile(name="big.jpg", label=None, read=lambda limit=None: data), DECODER)
    served = DECODER.decode(as_json(data))
    np.testing.assert_array_equal(pixels, served.pixels[0])
    assert (stats["width"], stats["height"]) == (served.stats[0]["width"], served.stats[0]["height"]) == (400, 300)
