"""Image bytes -> checked pixels, the one way torchship reads an image (prepare, ingest, the service, batch scoring).

`inspect_image` looks before it decodes: the file's size, then the header (format and pixel count, so an image over
the pixel limit is refused unread), then the whole decode (a truncated JPEG fails there), then the pixels'
statistics. It never raises on bad input: what it found goes into the returned record, and the rules are judged on
those records (tasks/modalities/image/expectations.py), so one pass names every bad file with every rule it breaks.
`open_image` and `decode_image` are its two halves: the service opens every image of a request (headers only) before
it decodes any.

Every reader gets the same pixels: EXIF orientation applied (a phone photo stands as a browser shows it), a 16-bit
grayscale PNG scaled to 8 bits (not clipped), a multi-picture JPEG (MPO: phones' HDR photos) and an animated PNG read
by their first picture. Given the size the pixels will be fitted to, the decode is reduced first (JPEG: decoded at
1/2, 1/4 or 1/8 scale; others: averaged by an integer factor) while it stays REDUCING_GAP times that size, and only
then converted: a huge image never becomes a full-size RGB array.

`fit_size` is the one resize rule (documented in docs/images.md): scale so the image covers the model's height x
width, keeping its aspect ratio, then crop the centre. The served graph takes pixels already at that size.
"""
from __future__ import annotations

import hashlib
import io
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

FORMATS = ("PNG", "JPEG")
READ_AS = {"MPO": "JPEG"}   # a JPEG that carries more pictures (Android Ultra HDR, iOS HDR): its first one is read
# Pillow's modes by what the model sees: one channel, three, or three plus alpha (dropped: composited on black).
GRAY, COLOR = "L", "RGB"
MODE_OF = {"1": GRAY, "L": GRAY, "I": GRAY, "I;16": GRAY, "F": GRAY, "LA": GRAY, "RGB": COLOR, "RGBA": COLOR,
           "P": COLOR, "PA": COLOR, "CMYK": COLOR, "YCbCr": COLOR, "LAB": COLOR, "HSV": COLOR}
CHANNELS = {GRAY: 1, COLOR: 3}
SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")   # Pillow's readings of a 16-bit grayscale PNG
SCALE_16_TO_8 = ((np.arange(1 << 16, dtype=np.uint32) * 255 + 32767) // 65535).astype(np.uint8)   # rounded
# A reduced image stays at least this many times the size it is fitted to: Pillow's figure (Image.thumbnail's
# reducing_gap) for a result indistinguishable from resampling the whole image.
REDUCING_GAP = 3
EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the transpose that makes the image stand as it was shot (ImageOps.exif_transpose's table).
UPRIGHT = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE", 6: "ROTATE_270",
           7: "TRANSVERSE", 8: "ROTATE_90"}


@dataclass(frozen=True)
class ImageLimits:
    """What is read at all: larger files and pixel counts are refused before they are decoded."""

    max_file_bytes: int = 20 << 20
    max_pixels: int = 40_000_000
    file_setting: str = "images.max_file_mb"   # what a refusal names as the limit's source
    pixels_setting: str = "images.max_pixels"


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
                  mode: str | None = None, fit: tuple[int, int] | None = None) -> Inspected:
    """Read `data` as far as the limits allow; the record says what was found (never raises on bad input). The
    pixels are in the file's own reading (GRAY or COLOR), or converted to `mode` when given (the service converts
    an upload to its model's mode); with `fit` (height, width) they are reduced first (see the module's note)."""
    found, image = open_image(name, data, limits, label)
    return found if image is None else decode_image(found, image, mode, fit)


def open_image(name: str, data: bytes, limits: ImageLimits, label: str | None = None) -> tuple[Inspected, object]:
    """(the record, the opened image) from the file's size and header alone; the image is None when the record
    already refuses it (over a limit: `too_large`; not an image of a read format or mode). Nothing is decoded."""
    from PIL import Image

    found = Inspected(name=name, label=label, file_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    if len(data) > limits.max_file_bytes:
        found.error = (f"{len(data):,} bytes is over the limit of {limits.max_file_bytes:,} ({limits.file_setting}): "
                       "not read")
        found.too_large = True
        return found, None
    with _pillow_errors(found, limits):
        image = Image.open(io.BytesIO(data))   # the header only
        found.format, (found.width, found.height) = READ_AS.get(image.format, image.format), image.size
        found.file_mode, found.mode = image.mode, MODE_OF.get(image.mode)
        if found.format not in FORMATS:
            found.error = f"a {image.format} image: only {' and '.join(FORMATS)} are read"
        elif found.width * found.height > limits.max_pixels:
            found.error = (f"{found.width}x{found.height} = {found.width * found.height:,} pixels is over the limit "
                           f"of {limits.max_pixels:,} ({limits.pixels_setting}): not decoded")
            found.too_large = True
        elif found.mode is None:
            found.error = f"mode {image.mode} has no grayscale or colour reading"
        else:
            return found, image
    return found, None


def decode_image(found: Inspected, image, mode: str | None = None, fit: tuple[int, int] | None = None) -> Inspected:
    """The opened image (open_image) decoded, upright, in 8 bits, reduced towards `fit` and converted to `mode` (or
    its own reading): its pixels and statistics go into `found`, or why it cannot be decoded."""
    with _pillow_errors(found):
        if fit is not None and found.format == "JPEG" and _reduction(image.size, fit) > 1:
            factor = _reduction(image.size, fit)   # the JPEG decoder scales by 1/2, 1/4 or 1/8 at most this much
            image.draft(None, (-(-image.width // factor), -(-image.height // factor)))
        image.load()   # the whole decode: a truncated or corrupt body fails here
        orientation = _orientation(image)
        image = _eight_bit(image)
        if fit is not None and _reduction(image.size, fit) > 1:
            image = image.reduce(_reduction(image.size, fit))
        if orientation in UPRIGHT:
            from PIL import Image

            image = image.transpose(getattr(Image.Transpose, UPRIGHT[orientation]))
            if orientation >= 5:   # a quarter turn: the image stands the other way
                found.width, found.height = found.height, found.width
        pixels = as_array(image, mode or found.mode)
        found.decodable, found.pixels = True, pixels
        found.brightness, found.contrast = float(pixels.mean()), float(pixels.std())
    return found


@contextmanager
def _pillow_errors(found: Inspected, limits: ImageLimits | None = None):
    """Pillow's ways of refusing a file, written into `found.error` (and `too_large`) instead of raised."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except UnidentifiedImageError:
        found.error = "not an image Pillow can identify (PNG and JPEG are read)"
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:   # over Pillow's own limit
        size = re.search(r"\((\d+) pixels\)", str(exc))
        told = f"{int(size.group(1)):,} pixels" if size else "its pixel count"
        limit = f"{limits.max_pixels:,} ({limits.pixels_setting})" if limits else "Pillow's own"
        found.error = f"{told} (from its header) is over the limit of {limit}: not decoded"
        found.too_large = True
    except (OSError, ValueError, SyntaxError, EOFError) as exc:   # the body is broken
        found.error = f"cannot be decoded: {_first_line(exc)}"


def _reduction(size: tuple[int, int], fit: tuple[int, int]) -> int:
    """The integer factor an image of `size` (width, height) may shrink by and still be REDUCING_GAP times the size
    fit_size scales it to (covering `fit`, (height, width))."""
    width, height = size
    scale = max(fit[0] / height, fit[1] / width)
    return max(1, int(1 / (scale * REDUCING_GAP)))


def _orientation(image) -> int | None:
    """The EXIF orientation tag of a loaded image, or None; a broken EXIF block is ignored, as browsers do."""
    try:
        return image.getexif().get(EXIF_ORIENTATION)
    except Exception:   # noqa: BLE001 - Pillow's EXIF parser raises many kinds on a malformed block
        return None


def _eight_bit(image):
    """A 16-bit grayscale image scaled to 8 bits (0..65535 -> 0..255, rounded); 1-bit and palette images expanded
    to a mode that averages (reduce); any other image as it is."""
    from PIL import Image

    if image.mode in SIXTEEN_BIT:
        levels = np.asarray(image)
        if levels.dtype != np.uint16:   # mode I: 32-bit integers holding 16-bit levels
            levels = np.clip(levels, 0, 65535).astype(np.uint16)
        return Image.fromarray(SCALE_16_TO_8[levels], mode=GRAY)
    if image.mode == "1":
        return image.convert(GRAY)
    if image.mode in ("P", "PA"):
        return image.convert("RGBA" if image.mode == "PA" or "transparency" in image.info else COLOR)
    return image



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
