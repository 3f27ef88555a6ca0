"""Request images checked and brought to the model's size: the image modality's request decoder (the table one is
tasks/modalities/table/serving.py's RowDecoder, and this one has the same face: decode, feed, features).

A request carries images as JSON, `{"images": ["<base64 of a PNG or JPEG file>", ...]}` (a `data:` URL prefix and
line-wrapped base64 are allowed), or as a multipart/form-data upload with one or more `image` parts (`curl -F
image=@sample.png`), read by a streaming form-data parser that stops at `images.max_parts` parts or a part over the
file limit. Every image of a request is opened (its header only) before any is decoded: a file over its byte limit, an
image over its pixel limit, or images over the request's pixel budget together, and the request is refused with 413
naming the limit and its setting, nothing decoded. An image that is not decodable, or has a side under its minimum,
gets 422 naming the image and the rule. The limits are the model's own (the rule set its training images were read
by, carried in its schema), tightened by the serving host's `images` params and by `images.serve_pixels_factor` times
the model's own size (`limits_for`). An accepted image is decoded by the pipeline's own rule
(tasks/modalities/image/decode.py, reduced towards the model's size before it is converted), converted to the model's
mode (a grayscale upload to a colour model is read as colour) and scaled and centre-cropped to the model's size.

The request log keeps no pixels: per image its statistics (width, height, mode, bytes, brightness, contrast), and
the model's own embedding projection, which the served graph outputs beside the probabilities."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

import msgspec
import numpy as np

from tasks.core.refusals import BodyRefused, RowsRefused
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape, ReadLimits, image_shape
from tasks.modalities.image.decode import ImageLimits, decode_image, fit_size, open_image
from tasks.modalities.image.settings import ImagesParams

IMAGES_SHAPE = ('body must be {"images": ["<base64 PNG or JPEG>", ...]} with at least one image, or a '
                'multipart/form-data upload with `image` parts')
FIELD = "image"
LOGGED = ("width", "height", "mode", "file_bytes", "brightness", "contrast")
HASH_CHARS = 16   # of the file's sha256, logged: the same image sent twice is one row (a canary pairs on it)
SHOWN_PARTS = 5   # other parts' names an upload without `image` parts is told (never all of them)
MIB = 1 << 20


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    images: list[str]


@dataclass(frozen=True)
class RequestLimits:
    """What one request may carry in all."""

    max_images: int = 256              # JSON items or multipart parts (images.max_parts)
    max_pixels: int = 40_000_000       # of its images together, from their headers (images.max_request_pixels)


def limits_for(shape: ImageShape, params: ImagesParams) -> tuple[ImageLimits, int, RequestLimits]:
    """(per-image limits, shortest side, request limits) a service applies to a model of this shape: the rule set it
    was trained under (its schema's; a schema exported before it carried one: the host's params), only ever
    tightened by the host's `images` params, and the pixels of one image also held to `serve_pixels_factor` times the
    model's own (an image far larger than anything it was trained on is refused unread)."""
    host = ReadLimits(max_file_bytes=int(params.max_file_mb * MIB), max_pixels=params.max_pixels,
                      min_side=params.min_side)
    trained = shape.limits or host
    file_bytes = min((host.max_file_bytes, "images.max_file_mb"),
                     (trained.max_file_bytes, "the model's training limit, from its schema"), key=lambda c: c[0])
    model_pixels = int(params.serve_pixels_factor * shape.height * shape.width)
    pixels = min((model_pixels, f"images.serve_pixels_factor: {params.serve_pixels_factor:g}x the model's "
                                f"{shape.height}x{shape.width}"),
                 (host.max_pixels, "images.max_pixels"),
                 (trained.max_pixels, "the model's training limit, from its schema"), key=lambda c: c[0])
    limits = ImageLimits(max_file_bytes=file_bytes[0], max_pixels=pixels[0], file_setting=file_bytes[1],
                         pixels_setting=pixels[1])
    return limits, max(host.min_side, trained.min_side), RequestLimits(params.max_parts, params.max_request_pixels)


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

    inline_body_bytes = 0   # the largest body decoded on the event loop: none (one image's decode can take seconds)

    def __init__(self, schema: Schema, limits: ImageLimits, min_side: int = 1,
                 request: RequestLimits = RequestLimits()):
        self.schema, self.limits, self.min_side, self.request = schema, limits, min_side, request
        self.shape = image_shape(schema).shape
        self._decoder = msgspec.json.Decoder(_Body)

    def decode(self, body: bytes, content_type: str | None = None) -> ImageRows:
        files = self._upload_files(body, content_type) if _is_multipart(content_type) else self._json_files(body)
        opened = [open_image(f"image {index}", data, self.limits) for index, data in enumerate(files)]
        self._refuse_unread(opened)
        rows, problems = ImageRows(), []
        for index, (record, image) in enumerate(opened):
            if image is None:
                problems.append(_problem(index, "decodable", record.error or "not decodable"))
            elif min(record.width, record.height) < self.min_side:
                problems.append(_problem(index, "min_side", f"{record.width}x{record.height}: both sides must be "
                                                            f"at least {self.min_side} pixels (images.min_side)"))
            elif decode_image(record, image, image_shape(self.schema).mode, self.shape[:2]).pixels is None:
                problems.append(_problem(index, "decodable", record.error or "not decodable"))
            else:
                rows.pixels.append(fit_size(record.pixels, self.shape[0], self.shape[1]))
                record.pixels = None   # the full decode goes as soon as its fitted copy is made
                rows.stats.append({**{key: getattr(record, key) for key in LOGGED},
                                   "sha256": record.sha256[:HASH_CHARS]})
        if problems:
            raise RowsRefused(problems)
        return rows

    def _refuse_unread(self, opened: list) -> None:
        """413 before anything is decoded: an image over its byte or pixel limit, or the request's images over its
        pixel budget together."""
        for index, (record, _) in enumerate(opened):
            if record.too_large:
                raise BodyRefused(413, f"image {index}: {record.error}")
        total = sum(record.width * record.height for record, image in opened if image is not None)
        if total > self.request.max_pixels:
            raise BodyRefused(413, f"{len(opened)} images of {total:,} pixels together are over the request's "
                                   f"budget of {self.request.max_pixels:,} (images.max_request_pixels): none decoded")

    def _json_files(self, body: bytes) -> list[bytes]:
        try:
            images = self._decoder.decode(body).images
        except msgspec.DecodeError as exc:
            if isinstance(exc, msgspec.ValidationError):
                raise BodyRefused(422, f"{IMAGES_SHAPE} ({exc})") from None
            raise BodyRefused(400, f"body is not valid JSON: {exc}") from None
        if not images:
            raise BodyRefused(422, IMAGES_SHAPE)
        if len(images) > self.request.max_images:
            raise BodyRefused(413, f"{len(images):,} images in one request: at most {self.request.max_images:,} "
                                   "(images.max_parts)")
        files, problems = [], []
        for index, text in enumerate(images):
            encoded = text.split(",", 1)[1] if text.startswith("data:") and "," in text else text
            try:   # line breaks and spaces are dropped first: `base64` wraps its output at 76 columns
                files.append(base64.b64decode("".join(encoded.split()), validate=True))
            except (binascii.Error, ValueError):
                problems.append(_problem(index, "base64", "not base64 (RFC 4648) text"))
        if problems:
            raise RowsRefused(problems)
        return files

    def _upload_files(self, body: bytes, content_type: str) -> list[bytes]:
        """The `image` parts of a multipart/form-data body, parsed as a stream that stops at the first limit broken:
        more than `images.max_parts` parts, or a part over the file limit."""
        import multipart

        boundary = multipart.parse_options_header(content_type)[1].get("boundary")
        if not boundary:
            raise BodyRefused(400, "a multipart body needs a boundary in its content-type (curl -F image=@file.png "
                                   "sets one)")
        files, others, part = [], [], None
        try:
            with multipart.PushMultipartParser(boundary, content_length=len(body),
                                               max_segment_count=self.request.max_images,
                                               max_segment_size=self.limits.max_file_bytes) as parser:
                for event in parser.parse(body):
                    if isinstance(event, multipart.MultipartSegment):
                        part = [] if event.name == FIELD else None
                        if part is None and len(others) < SHOWN_PARTS:
                            others.append(str(event.name)[:40])
                    elif event is None:
                        if part is not None:
                            files.append(b"".join(part))
                    elif part is not None:
                        part.append(event)
        except multipart.ParserLimitReached as exc:
            raise BodyRefused(413, f"the upload breaks a limit ({exc}): at most {self.request.max_images:,} parts "
                                   f"(images.max_parts), each at most {self.limits.max_file_bytes:,} bytes "
                                   f"({self.limits.file_setting})") from None
        except multipart.MultipartError as exc:
            raise BodyRefused(400, f"not a valid multipart/form-data body: {exc}") from None
        if not files:
            raise BodyRefused(422, f"no `{FIELD}` part in the upload (parts: {', '.join(others) or 'none'}"
                                   f"{', ...' if len(others) == SHOWN_PARTS else ''}); {IMAGES_SHAPE}")
        return files

    def feed(self, rows: ImageRows) -> dict[str, np.ndarray]:
        return {FIELD: np.stack(rows.pixels)}

    def features(self, rows: ImageRows, index: int) -> dict:
        """What the request log keeps of image `index` (never its pixels)."""
        return rows.stats[index]

    def blank(self) -> ImageRows:
        """One mid-grey image at the model's size (the warm-up)."""
        return ImageRows([np.full(self.shape, 128, dtype=np.uint8)], [dict.fromkeys((*LOGGED, "sha256"))])

    def empty(self) -> ImageRows:
        """No images yet (batch scoring fills it as it reads)."""
        return ImageRows()

    def inputs(self) -> set[str]:
        """The served graph's one input: the pixels."""
        return {FIELD}

    def bare_inputs(self, rows: ImageRows) -> np.ndarray:
        """What a bare image model takes: the pixels themselves."""
        return self.feed(rows)[FIELD]


def _problem(index: int, rule: str, message: str) -> dict:
    return {"row": index, "field": FIELD, "rule": rule, "message": message}


def _is_multipart(content_type: str | None) -> bool:
    """Whether a content type is a multipart one (media types are case-insensitive: `Multipart/form-data` is)."""
    return content_type is not None and content_type.lstrip()[:10].lower() == "multipart/"


class ImageServing:
    """What the service takes of the image modality: its request decoding, its OpenAPI request, its batch scoring."""

    def decoder(self, schema: Schema, host: ImagesParams | None = None) -> ImageDecoder:
        """Images by the model's shape and the limits it was trained under (its schema's), which the serving host's
        `images` params may only tighten."""
        return ImageDecoder(schema, *limits_for(image_shape(schema), host or ImagesParams()))

    def document(self, variant) -> dict:
        """/predict's request for an image version: JSON with base64 files, or a multipart upload of `image`
        parts; and the wording of the answers that differ by modality."""
        shape = image_shape(variant.schema)
        return {"description": f"Scores images ({shape.height}x{shape.width} {shape.mode}: each is scaled to cover "
                               "that size, aspect kept, centre-cropped and converted to its mode). "
                               f"{IMAGES_SHAPE}.",
                "content": {"application/json": {"schema": {
                    "type": "object", "title": "PredictImages", "required": ["images"], "additionalProperties": False,
                    "properties": {"images": {"type": "array", "minItems": 1, "items": {
                        "type": "string", "format": "byte",
                        "description": "a PNG or JPEG file, base64 (a `data:` URL prefix is allowed)"}}}}},
                    "multipart/form-data": {"schema": {
                        "type": "object", "title": "PredictUpload", "required": [FIELD],
                        "properties": {FIELD: {"type": "array", "items": {"type": "string", "format": "binary"},
                                               "description": "one or more PNG or JPEG files "
                                                              "(curl -F image=@file.png)"}}}}},
                "components": {}, "items": "image",
                "too_large": "the body is over serve.max_body_mb (the first limit a request meets), an image over its "
                             "file or pixel limit (the model's own, images.max_file_mb, images.max_pixels, "
                             "images.serve_pixels_factor x the model's size: read from its header, before decoding), "
                             "the request's images over images.max_request_pixels together, or more than "
                             "images.max_parts images",
                "refused": "images that break the rules: one problem per image (decodable, min_side, base64), or a "
                           "body of another shape"}

    def predict(self, source, output, variant, params, chunk: int, show_progress: bool = True):
        """`torchship predict`: a folder or a manifest of images, scored as the service reads them."""
        from tasks.modalities.image.batch import MAX_CHUNK, predict_images

        return predict_images(source, output, variant, params.images.path_column, params.data.target,
                              min(chunk, MAX_CHUNK), show_progress)


SERVING = ImageServing()
