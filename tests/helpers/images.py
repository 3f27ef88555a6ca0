"""Image sets the tests make on disk: a class-folder set of rendered shapes, and the bad files users bring (each
made for real: a decompression bomb is a real 20,000 x 20,000 PNG, a truncated JPEG a real JPEG cut short)."""
from __future__ import annotations

import io
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

from tasks.images.sources import render_shapes

CLASSES = ["circle", "cross", "square", "triangle"]


def shapes_folder(root: Path, count: int = 120, seed: int = 0, side: int = 32) -> Path:
    """`root/<shape>/<index>.png`: `count` rendered shapes, balanced over CLASSES."""
    from PIL import Image

    pixels, labels = render_shapes(count, seed, side)
    for index, (image, label) in enumerate(zip(pixels, labels)):
        (root / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / label / f"{index}.png")
    return root


def bomb_png(path: Path, width: int = 20_000, height: int = 20_000) -> Path:
    """A valid grayscale PNG of width x height zeros: a few hundred KiB on disk, 400 MB decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor, row = zlib.compressobj(9), b"\0" * (width + 1)   # filter byte 0, then the row
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def add_bad_files(root: Path) -> dict[str, str]:
    """The bad inputs of the image contract, added to a shapes folder: {relative name: the rule it breaks (a word
    of it)}. The set's own first image is copied into another class folder (a duplicate that a split would leak)."""
    from PIL import Image

    sample = np.asarray(Image.open(next((root / "circle").glob("*.png"))).convert("RGB"))
    bomb_png(root / "circle" / "bomb.png")
    (root / "circle" / "notes.png").write_text("a text file named .png\n")
    (root / "circle" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    jpeg = io.BytesIO()
    Image.fromarray(sample).save(jpeg, format="JPEG")
    (root / "square" / "truncated.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    Image.new("RGB", (1, 1), (200, 10, 10)).save(root / "square" / "tiny.png")
    Image.fromarray(sample[:, :, 0]).save(root / "triangle" / "gray.png")
    first = sorted((root / "circle").glob("[0-9]*.png"))[0]
    shutil.copy(first, root / "cross" / "copy.png")
    (root / "hexagon").mkdir(exist_ok=True)
    Image.fromarray(255 - sample).save(root / "hexagon" / "unknown-class.png")
    Image.new("RGB", sample.shape[1::-1], (128, 128, 128)).save(root / "cross" / "blank.png")
    return {"circle/bomb.png": "decodable", "circle/notes.png": "decodable", "circle/corrupt.png": "decodable",
            "square/truncated.jpg": "decodable", "square/tiny.png": "both sides", "triangle/gray.png": "mode",
            "cross/copy.png": "duplicate", "hexagon/unknown-class.png": "class set", "cross/blank.png": "contrast"}
