"""Request images checked and brought to the model's size: the image modality's request decoder (the table one is
tasks/modalities/table/serving.py's RowDecoder, and this one has the same face: decode, feed, features).

A request carries images as JSON, `{"images": ["<base64 of a PNG or JPEG file>", ...]}` (a `data:` URL prefix is
allowed), or as a multipart/form-data upload with one or more `image` parts (`curl -F image=@sample.png`). Each image
is read by the pipeline's own rule (tasks/modalities/image/decode.py): over `images.max_file_mb` or
`images.max_pixels` (from
its header, before decoding: a decompression bomb never reaches memory) it is refused with 413; not decodable, or a
side under `images.min_side`, 422 naming the image and the rule. An accepted image is converted to the model's mode
(a grayscale upload to a colour model is read as colour) and scaled and centre-cropped to the model's size.

The request log keeps no pixels: per image its statistics (width, height, mode, bytes, brightness, contrast), and
the model's own embedding projection, which the served graph outputs beside the probabilities."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from email import policy
from email.parser import BytesParser

import msgspec
import numpy as np

from tasks.core.refusals import BodyRefused, RowsRefused
from tasks.core.schema_spec import Schema
from tasks.modalities.image.decode import ImageLimits, fit_size, inspect_image

IMAGES_SHAPE = ('body must be {"images": ["<base64 PNG or JPEG>", ...]} with at least one image, or a '
                'multipart/form-data upload with `image` parts')
FIELD = "image"
LOGGED = ("width", "height", "mode", "file_bytes", "brightness", "contrast")
HASH_CHARS = 16   # of the file's sha256, logged: the same image sent twice is one row (a canary pairs on it)


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    images: list[str]


@dataclass
class ImageRows:
    """Accepted images of one request (or of a micro-batch): their pixels at the model's size and their logged
    statistics."""

    pixels: list[np.ndarray] = field(default_factory=list)   # each (H, W, C) uint8
    stats: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.pixels)

    def extend(self, other: ImageRows) -> None:
        self.pixels += other.pixels
        self.stats += other.stats


class ImageDecoder:
    """Body bytes (and content type) -> accepted ImageRows, or BodyRefused / RowsRefused; ImageRows -> the served
    graph's feed ({"image": (N, H, W, C) uint8})."""

    def __init__(self, schema: Schema, limits: ImageLimits, min_side: int = 1):
        self.schema, self.limits, self.min_side = schema, limits, min_side
        self.shape = schema.image.shape
        self._decoder = msgspec.json.Decoder(_Body)

    def decode(self, body: bytes, content_type: str | None = None) -> ImageRows:
        files = _multipart_files(body, content_type) if content_type and content_type.startswith(
            "multipart/") else self._json_files(body)
        rows, problems = ImageRows(), []
        for index, data in enumerate(files):
            record = inspect_image(f"image {index}", data, self.limits, mode=self.schema.image.mode)
            if record.pixels is None:
                if record.too_large:
                    raise BodyRefused(413, f"image {index}: {record.error} (images.max_file_mb / images.max_pixels)")
                problems.append(_problem(index, "decodable", record.error or "not decodable"))
                continue
            if min(record.width, record.height) < self.min_side:
                problems.append(_problem(index, "min_side", f"{record.width}x{record.height}: both sides must be "
                                                            f"at least {self.min_side} pixels (images.min_side)"))
                continue
            rows.pixels.append(fit_size(record.pixels, self.shape[0], self.shape[1]))
            rows.stats.append({**{key: getattr(record, key) for key in LOGGED}, "sha256": record.sha256[:HASH_CHARS]})
        if problems:
            raise RowsRefused(problems)
        return rows

    def _json_files(self, body: bytes) -> list[bytes]:
        try:
            images = self._decoder.decode(body).images
        except msgspec.DecodeError as exc:
            if isinstance(exc, msgspec.ValidationError):
                raise BodyRefused(422, f"{IMAGES_SHAPE} ({exc})") from None
            raise BodyRefused(400, f"body is not valid JSON: {exc}") from None
        if not images:
            raise BodyRefused(422, IMAGES_SHAPE)
        files, problems = [], []
        for index, text in enumerate(images):
            encoded = text.split(",", 1)[1] if text.startswith("data:") and "," in text else text
            try:
                files.append(base64.b64decode(encoded, validate=True))
            except (binascii.Error, ValueError):
                problems.append(_problem(index, "base64", "not base64 (RFC 4648) text"))
        if problems:
            raise RowsRefused(problems)
        return files

    def feed(self, rows: ImageRows) -> dict[str, np.ndarray]:
        return {FIELD: np.stack(rows.pixels)}

    def features(self, rows: ImageRows, index: int) -> dict:
        """What the request log keeps of image `index` (never its pixels)."""
        return rows.stats[index]

    def blank(self) -> ImageRows:
        """One mid-grey image at the model's size (the warm-up)."""
        return ImageRows([np.full(self.shape, 128, dtype=np.uint8)], [dict.fromkeys((*LOGGED, "sha256"))])


def _problem(index: int, rule: str, message: str) -> dict:
    return {"row": index, "field": FIELD, "rule": rule, "message": message}


def _multipart_files(body: bytes, content_type: str) -> list[bytes]:
    """The `image` parts of a multipart/form-data body (the standard library's MIME parser: the body is already
    bounded by serve.max_body_mb)."""
    message = BytesParser(policy=policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\nMIME-Version: 1.0\r\n\r\n" + body)
    if not message.is_multipart():
        raise BodyRefused(400, "a multipart body without parts: send `image` parts (curl -F image=@file.png)")
    files, others = [], []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name == FIELD:
            files.append(part.get_payload(decode=True) or b"")
        else:
            others.append(str(name))
    if not files:
        raise BodyRefused(422, f"no `{FIELD}` part in the upload (parts: {others or 'none'}); {IMAGES_SHAPE}")
    return files
