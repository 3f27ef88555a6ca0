"""Image sets the tests make on disk: a class-folder set of rendered shapes, and the bad files users bring (each
made for real: a decompression bomb is a real 20,000 x 20,000 PNG, a truncated JPEG a real JPEG cut short)."""
from __future__ import annotations

import io
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.sources import render_shapes

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


def add_bad_files(root: Path, classes: list[str] = CLASSES, mode: str = "RGB") -> dict[str, str]:
    """The bad inputs of the image contract, added to a class-folder set of `mode` images whose first class folder
    holds at least one PNG: {relative name: a word of the rule it breaks}. The first class's first image is copied
    into another class folder (a duplicate a split would leak); an image of the other mode joins the set."""
    from PIL import Image

    first = sorted((root / classes[0]).glob("*.png"))[0]
    sample = np.asarray(Image.open(first).convert(mode))
    other = np.asarray(Image.fromarray(sample).convert("RGB" if mode == "L" else "L"))
    c0, c1, c2, c3 = (classes * 4)[:4]
    bomb_png(root / c0 / "bomb.png")
    (root / c0 / "notes.png").write_text("a text file named .png\n")
    (root / c0 / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    jpeg = io.BytesIO()
    Image.fromarray(sample).save(jpeg, format="JPEG")
    (root / c1 / "truncated.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    Image.new(mode, (1, 1), 200).save(root / c1 / "tiny.png")
    Image.fromarray(other).save(root / c2 / "other-mode.png")
    shutil.copy(first, root / c3 / "copy.png")
    (root / "not-a-class").mkdir(exist_ok=True)
    Image.fromarray(255 - sample).save(root / "not-a-class" / "unknown-class.png")
    grey = 128 if mode == "L" else (128, 128, 128)
    Image.new(mode, Image.fromarray(sample).size, grey).save(root / c3 / "blank.png")
    return {f"{c0}/bomb.png": "decodable", f"{c0}/notes.png": "decodable", f"{c0}/corrupt.png": "decodable",
            f"{c1}/truncated.jpg": "decodable", f"{c1}/tiny.png": "both sides", f"{c2}/other-mode.png": "mode",
            f"{c3}/copy.png": "duplicate", "not-a-class/unknown-class.png": "class set", f"{c3}/blank.png": "contrast"}


def served_image_model(folder: Path, schema, widths: list[int] | None = None, seed: int = 0) -> Path:
    """`folder/model.onnx`: an untrained small ResNet for `schema`'s images, exported (legacy: fast) and composed into
    the served graph (uint8 pixels in; probabilities and the embedding projection out), as the service loads it."""
    import onnx
    import torch

    from models.cnn import ImageLayout, ImageResNet
    from tasks.modalities.image.graph import compose_image_model
    from tasks.variants.exporters import export_onnx

    torch.manual_seed(seed)
    shape = image_shape(schema)
    layout = ImageLayout(shape.height, shape.width, shape.channels, [0.4] * shape.channels, [0.25] * shape.channels,
                         len(schema.classes))
    model = ImageResNet(layout, widths=widths or [8, 16]).eval()
    export_onnx(model, schema, "legacy", folder / "bare.onnx")
    onnx.save(compose_image_model(onnx.load(str(folder / "bare.onnx")), schema), folder / "model.onnx")
    return folder / "model.onnx"
