"""Image files of every kind users send, made in memory with Pillow (and by hand where Pillow cannot write one): PNG in
each mode, 16-bit PNG, JPEG, CMYK JPEG, multi-picture JPEG (MPO), EXIF-rotated files, animated PNG and GIF, TIFF; and
the mutations a fuzzer applies to them (byte flips, truncations, a header claiming a huge size)."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np

KINDS = ("png", "png-gray", "png-16", "png-rgb16", "png-rgba", "png-palette", "apng", "jpeg", "jpeg-gray",
         "jpeg-cmyk", "mpo", "jpeg-exif", "png-exif", "gif", "tiff")
MUTATIONS = ("none", "flip", "truncate", "huge-header", "junk-tail")


def png_16bit(levels: np.ndarray) -> bytes:
    """A 16-bit PNG of `levels` ((H, W) grayscale or (H, W, 3) colour, uint16), written chunk by chunk."""
    height, width = levels.shape[:2]
    colour = 2 if levels.ndim == 3 else 0
    rows = levels.astype(">u2").reshape(height, -1).view(np.uint8).reshape(height, -1)
    raw = b"".join(b"\0" + row.tobytes() for row in rows)   # filter byte 0, then the row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def saved(image, kind: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=kind, **options)
    return buffer.getvalue()


def image_file(kind: str, height: int = 24, width: int = 32, seed: int = 0, orientation: int = 6) -> bytes:
    """One file of `kind` (KINDS), random pixels of this size (`orientation`: the EXIF tag of the -exif kinds)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    picture = Image.fromarray(rgb)
    exif = Image.Exif()
    exif[0x0112] = orientation
    second = Image.fromarray(255 - rgb)
    makers = {
        "png": lambda: saved(picture, "PNG"),
        "png-gray": lambda: saved(picture.convert("L"), "PNG"),
        "png-16": lambda: png_16bit(rng.integers(0, 65536, (height, width), dtype=np.uint16)),
        "png-rgb16": lambda: png_16bit(rng.integers(0, 65536, (height, width, 3), dtype=np.uint16)),
        "png-rgba": lambda: saved(picture.convert("RGBA"), "PNG"),
        "png-palette": lambda: saved(picture.convert("P"), "PNG", transparency=0),
        "apng": lambda: saved(picture, "PNG", save_all=True, append_images=[second]),
        "jpeg": lambda: saved(picture, "JPEG"),
        "jpeg-gray": lambda: saved(picture.convert("L"), "JPEG"),
        "jpeg-cmyk": lambda: saved(picture.convert("CMYK"), "JPEG"),
        "mpo": lambda: saved(picture, "MPO", save_all=True, append_images=[second]),
        "jpeg-exif": lambda: saved(picture, "JPEG", exif=exif),
        "png-exif": lambda: saved(picture, "PNG", exif=exif),
        "gif": lambda: saved(picture.convert("P"), "GIF", save_all=True, append_images=[second.convert("P")]),
        "tiff": lambda: saved(picture, "TIFF"),
    }
    return makers[kind]()


def mutated(data: bytes, mutation: str, rng: np.random.Generator) -> bytes:
    """`data` after one mutation (MUTATIONS): a few bytes flipped, cut short, the first size field that a PNG or
    JPEG header holds set to a huge size, or junk appended."""
    if mutation == "flip":
        flipped = bytearray(data)
        for position in rng.integers(0, len(data), int(rng.integers(1, 9))):
            flipped[position] ^= int(rng.integers(1, 256))
        return bytes(flipped)
    if mutation == "truncate":
        return data[:int(rng.integers(0, len(data)))]
    if mutation == "huge-header":
        return claimed_size(data, int(rng.integers(5_000, 60_000)))
    if mutation == "junk-tail":
        return data + rng.bytes(int(rng.integers(1, 2048)))
    return data


def claimed_size(data: bytes, side: int) -> bytes:
    """The file with its header claiming side x side pixels (PNG's IHDR, with its CRC fixed; a JPEG's first SOF
    marker); other files unchanged. The pixel data is left as it was: a decoder that trusts the header is fooled."""
    if data.startswith(b"\x89PNG"):
        body = b"IHDR" + struct.pack(">II", side, side) + data[24:29]
        return data[:12] + body + struct.pack(">I", zlib.crc32(body)) + data[33:]
    for marker in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2"):
        at = data.find(marker)
        if at > 0:
            side = min(side, 65535)
            return data[:at + 5] + struct.pack(">HH", side, side) + data[at + 9:]
    return data
