"""A split of images on disk: one Parquet file of decoded pixels and their metadata, not thousands of loose files
(a DVC output of a handful of objects, pulled by a worker in seconds).

Columns: `image`, the (H, W, C) uint8 pixels at the model's size as one fixed-size binary value (read back as one
contiguous array, no per-image copies); the label column; and the metadata the checks judged (METADATA). Written in
row groups, so neither side holds a large set twice."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.artifacts import write_atomic

IMAGE = "image"
METADATA = ("name", "sha256", "file_bytes", "format", "width", "height", "mode", "file_mode", "brightness",
            "contrast")
ROW_GROUP = 1024


def write_split(path: Path, batches: Iterable[tuple[np.ndarray, pd.DataFrame]], target: str,
                shape: tuple[int, int, int]) -> int:
    """Write (pixels (n, H, W, C) uint8, metadata rows with the label in `target`) batches atomically; returns the
    images written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = int(np.prod(shape))
    written = 0

    def write(tmp: Path) -> None:
        nonlocal written
        schema = None
        writer = None
        try:
            for pixels, rows in batches:
                if pixels.shape[1:] != shape:
                    raise ValueError(f"images of shape {pixels.shape[1:]} in a split of {shape}")
                flat = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(len(pixels), size)
                images = pa.FixedSizeBinaryArray.from_buffers(pa.binary(size), len(flat),
                                                              [None, pa.py_buffer(flat.tobytes())])
                columns = {IMAGE: images, target: pa.array(rows[target].astype(str).tolist())}
                columns.update({name: pa.array(rows[name].tolist()) for name in METADATA if name in rows})
                table = pa.table(columns)
                if writer is None:
                    schema = table.schema
                    writer = pq.ParquetWriter(str(tmp), schema, compression="zstd")
                writer.write_table(table.cast(schema), row_group_size=ROW_GROUP)
                written += len(flat)
            if writer is None:
                raise ValueError("a split of no images")
        finally:
            if writer is not None:
                writer.close()

    write_atomic(path, write)
    return written


def read_pixels(path: Path, shape: tuple[int, int, int]) -> np.ndarray:
    """(N, H, W, C) uint8: the split's images in file order, in one array."""
    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=[IMAGE])[IMAGE].combine_chunks()
    size = int(np.prod(shape))
    if column.type.byte_width != size:
        raise ValueError(f"{path}: images of {column.type.byte_width} bytes, not {shape}")
    data = np.frombuffer(column.buffers()[1], dtype=np.uint8, count=(column.offset + len(column)) * size)
    return data[column.offset * size:].reshape(len(column), *shape)


def read_metadata(path: Path, target: str) -> pd.DataFrame:
    """The split's label and metadata columns, without the pixels."""
    import pyarrow.parquet as pq

    names = [n for n in pq.read_schema(path).names if n != IMAGE]
    frame = pq.read_table(path, columns=names).to_pandas()
    return frame.rename(columns={target: "label"}) if target != "label" else frame
