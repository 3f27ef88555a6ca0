"""Image bytes -> checked pixels, the one way torchship reads an image (prepare, ingest, the service, batch scoring).

`inspect_image` looks before it decodes: the file's size, then the header (format and pixel count, so a
decompression bomb is refused unread), then the whole decode (a truncated JPEG fails there), then the pixels'
statistics. It never raises on bad input: what it found goes into the returned record, and the rules are judged on
those records (tasks/modalities/image/expectations.py), so one pass names every bad file with every rule it breaks.

`fit_size` is the one resize rule (documented in docs/images.md): scale so the image covers the model's height x
width, keeping its aspect ratio, then crop the centre. The served graph takes pixels already at that size.
"""
from __future__ import annotations

import hashlib
import io
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

FORMATS = ("PNG", "JPEG")
# Pillow's modes by what the model sees: one channel, three, or three plus alpha (dropped: composited on black).
GRAY, COLOR = "L", "RGB"
MODE_OF = {"1": GRAY, "L": GRAY, "I": GRAY, "I;16": GRAY, "F": GRAY, "LA": GRAY, "RGB": COLOR, "RGBA": COLOR,
           "P": COLOR, "PA": COLOR, "CMYK": COLOR, "YCbCr": COLOR, "LAB": COLOR, "HSV": COLOR}
CHANNELS = {GRAY: 1, COLOR: 3}


@dataclass(frozen=True)
class ImageLimits:
    """What is read at all: larger files and pixel counts are refused before they are decoded."""

    max_file_bytes: int = 20 << 20
    max_pixels: int = 40_000_000


@dataclass
class Inspected:
    """One image file as the checks see it (a row of the metadata table), and its pixels when it decoded."""

    name: str                      # where it came from: a path relative to the source, or a packaged set's name
    label: str | None
    file_bytes: int
    sha256: str
    format: str | None = None      # PNG, JPEG, or what Pillow identified
    width: int | None = None
    height: int | None = None
    mode: str | None = None        # GRAY or COLOR after MODE_OF (the file's own mode is in `file_mode`)
    file_mode: str | None = None
    decodable: bool = False
    error: str | None = None       # why it is not decodable, in Pillow's (or our) words
    too_large: bool = False        # refused unread for its bytes or its pixel count (not for being broken)
    brightness: float | None = None   # mean pixel value, 0..255
    contrast: float | None = None     # pixel standard deviation: ~0 for a blank or constant image
    pixels: np.ndarray | None = field(default=None, repr=False)   # (H, W, C) uint8 in `mode`

    def row(self) -> dict:
        """The metadata row (no pixels)."""
        pixels = None if self.width is None or self.height is None else self.width * self.height
        aspect = None if not pixels else max(self.width, self.height) / max(1, min(self.width, self.height))
        return {"name": self.name, "label": self.label, "file_bytes": self.file_bytes, "sha256": self.sha256,
                "format": self.format, "width": self.width, "height": self.height, "pixels": pixels,
                "aspect": aspect, "mode": self.mode, "file_mode": self.file_mode, "decodable": self.decodable,
                "error": self.error, "brightness": self.brightness, "contrast": self.contrast}


def inspect_image(name: str, data: bytes, limits: ImageLimits, label: str | None = None,
                  mode: str | None = None) -> Inspected:
    """Read `data` as far as the limits allow; the record says what was found (never raises on bad input). The
    pixels are in the file's own reading (GRAY or COLOR), or converted to `mode` when given (the service converts
    an upload to its model's mode)."""
    from PIL import Image, UnidentifiedImageError

    found = Inspected(name=name, label=label, file_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    if len(data) > limits.max_file_bytes:
        found.error = f"{len(data):,} bytes is over the limit of {limits.max_file_bytes:,}: not read"
        found.too_large = True
        return found
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))   # the header only
            found.format, (found.width, found.height) = image.format, image.size
            found.file_mode, found.mode = image.mode, MODE_OF.get(image.mode)
            if image.format not in FORMATS:
                found.error = f"a {image.format} image: only {' and '.join(FORMATS)} are read"
                return found
            if found.width * found.height > limits.max_pixels:
                found.error = (f"{found.width}x{found.height} = {found.width * found.height:,} pixels is over the "
                               f"limit of {limits.max_pixels:,}: not decoded (a decompression bomb is refused unread)")
                found.too_large = True
                return found
            if found.mode is None:
                found.error = f"mode {image.mode} has no grayscale or colour reading"
                return found
            image.load()   # the whole decode: a truncated or corrupt body fails here
            pixels = as_array(image, mode or found.mode)
    except UnidentifiedImageError:
        found.error = "not an image Pillow can identify (PNG and JPEG are read)"
        return found
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:   # over Pillow's own limit
        size = re.search(r"\((\d+) pixels\)", str(exc))
        told = f"{int(size.group(1)):,} pixels" if size else "its pixel count"
        found.error = (f"{told} (from its header) is over the limit of {limits.max_pixels:,}: not decoded (a "
                       "decompression bomb is refused unread)")
        found.too_large = True
        return found
    except (OSError, ValueError, SyntaxError, EOFError) as exc:   # Pillow's ways of saying the body is broken
        found.error = f"cannot be decoded: {_first_line(exc)}"
        return found
    found.decodable, found.pixels = True, pixels
    found.brightness, found.contrast = float(pixels.mean()), float(pixels.std())
    return found


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def as_array(image, mode: str) -> np.ndarray:
    """(H, W, C) uint8 in `mode` (GRAY: C = 1, COLOR: C = 3); alpha is composited on black, as a viewer would on a
    dark page, so a transparent pixel is not read as its hidden colour."""
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (0, 0, 0, 255))
        image = Image.alpha_composite(background, image)
    converted = image.convert(mode)
    array = np.asarray(converted, dtype=np.uint8)
    return array[:, :, None] if array.ndim == 2 else array


def fit_size(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """(h, w, C) uint8 -> (height, width, C) uint8: scaled (bilinear, antialiased when shrinking) so it covers the
    target while keeping its aspect ratio, then centre-cropped; an image of the target size is returned as is."""
    h, w, channels = pixels.shape
    if (h, w) == (height, width):
        return pixels
    from PIL import Image

    scale = max(height / h, width / w)
    scaled = (max(width, round(w * scale)), max(height, round(h * scale)))   # Pillow sizes are (width, height)
    image = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    image = image.resize(scaled, Image.Resampling.BILINEAR)
    left, top = (scaled[0] - width) // 2, (scaled[1] - height) // 2
    array = np.asarray(image.crop((left, top, left + width, top + height)), dtype=np.uint8)
    return array[:, :, None] if array.ndim == 2 else array


def encode_png(pixels: np.ndarray) -> bytes:
    """(H, W, C) uint8 -> PNG bytes (packaged sets and tests make their files this way)."""
    from PIL import Image

    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
