"""prepare reads an image file only within the size limit: a file over `max_file_bytes` is measured (stat) and refused
without a byte of it in memory, and the second read of a file whose pixels the first pass did not keep is held to the
same limits (a file swapped for a decompression bomb between the two reads is refused, never decoded)."""
from __future__ import annotations

import io
import os
import threading
import tracemalloc

import pytest

from tasks.core.errors import DataError
from tasks.core.params_spec import PrepareParams
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image import prepare
from tasks.modalities.image.decode import ImageLimits
from tasks.modalities.image.sources import ImageFile, folder_images, manifest_images
from tests.helpers.images import shapes_folder

BIG = 256 << 20   # a sparse file: nothing on disk, 256 MiB in memory were it read


def png(side: int, value: int = 0) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (side, side), value).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    root = shapes_folder(tmp_path / "shapes", count=4, side=16)
    with open(root / "circle" / "huge.png", "wb") as handle:
        handle.truncate(BIG)
    files = folder_images(root)
    tracemalloc.start()
    try:
        records = prepare.inspect_files(files, ImageLimits(max_file_bytes=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    [huge] = [r for r in records if r.name == "circle/huge.png"]
    assert huge.too_large and huge.file_bytes == BIG and "not read" in huge.error, huge
    assert peak < 16 << 20, f"{peak:,} bytes were allocated: the file was read before its size was checked"
    assert sum(r.decodable for r in records) == 4


def test_a_manifest_row_naming_a_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")   # inside the manifest's folder; reading it would wait for a writer for ever
    (tmp_path / "manifest.csv").write_text("path,label\npipe.png,a\n")
    [pipe] = manifest_images(tmp_path / "manifest.csv", "label", "path")
    found = []
    reader = threading.Thread(target=lambda: found.append(prepare.inspect_files([pipe], ImageLimits())), daemon=True)
    reader.start()
    reader.join(10)
    assert found, "prepare blocked on a FIFO named by a manifest"
    assert "not a regular file" in found[0][0].error


def test_the_second_read_keeps_the_limits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(prepare, "KEEP_DECODED_BYTES", 0)   # no pixels kept: every image is read again
    reads: dict[str, int] = {}

    def swapped(name: str, first: bytes):
        def read(limit=None) -> bytes:   # the file on disk replaced by a bomb once the first pass has judged it
            reads[name] = reads.get(name, 0) + 1
            return first if reads[name] == 1 else png(3000)
        return read

    files = [ImageFile(name=f"{c}/{i}.png", label=c, read=swapped(f"{c}/{i}.png", png(8, 20 * i + 120 * (c == "b"))))
             for c in ("a", "b") for i in range(6)]
    with pytest.raises(DataError) as refused:
        prepare.prepare_images(files, "swapped", "label", ImagesParams(max_pixels=1_000_000, min_contrast=0),
                               PrepareParams())
    assert "changed while prepare read it" in str(refused.value)
