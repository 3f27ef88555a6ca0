"""Where images come from: a folder with one subfolder per class (torchvision's ImageFolder layout), a manifest
(CSV or Parquet: a path column and a label column), or a set that ships inside torchship's dependencies.

Packaged sets, nothing downloaded:
- `images:digits`: scikit-learn's 1,797 handwritten digits, 8x8 grayscale, 10 classes (inside the scikit-learn
  wheel; the UCI "Optical Recognition of Handwritten Digits" data, CC BY 4.0);
- `images:shapes`: noisy shapes torchship renders itself (32x32 colour: circle, square, triangle, cross), seeded.
Both become PNG files in memory, so every image takes the same path as a user's file. `data.drift` darkens or
brightens them and adds noise and a small rotation (a shifted image stream for the monitor).
"""
from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.core.errors import ConfigError, DataError
from tasks.modalities.image.decode import encode_png

PREFIX = "images:"
PACKAGED = ("digits", "shapes")
SUFFIXES = (".png", ".jpg", ".jpeg")
MANIFEST_SUFFIXES = (".csv", ".parquet", ".pq")
OUTSIDE_MANIFEST_RULE = "path_outside_manifest_folder"   # a row names a file outside the manifest's folder
UNUSABLE_PATH_RULE = "path_not_a_file_name"              # a row's path cannot name a file (a NUL byte, a loop)
SHAPES = ("circle", "square", "triangle", "cross")
SHAPE_SIDE = 32


@dataclass(frozen=True)
class ImageFile:
    """One image of a source, read when asked (a folder of thousands is listed, not loaded)."""

    name: str                       # the path relative to the source (posix), or `<set>/<index>` for a packaged set
    label: str | None               # None: the file is in no class folder
    read: Callable[..., bytes]      # read(limit=None): its bytes; a file on disk over `limit`: FileTooLarge, unread
    path: Path | None = None        # the file on disk (what a quarantine copies), None for a packaged image
    refusal: str | None = None      # a named rule its manifest row breaks: the file is never opened

    def read_within(self, limit: int) -> bytes:
        """Its bytes, or FileTooLarge when it holds more than `limit` (a file on disk is measured before it is read)."""
        data = self.read(limit)
        if len(data) > limit:   # one already in memory (a packaged set's, an accepted batch's)
            raise FileTooLarge(len(data), limit)
        return data


class FileTooLarge(ValueError):
    """A file over the size limit: measured, not read."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"{size:,} bytes is over the limit of {limit:,}: not read")
        self.size = size


def read_capped(path: Path, limit: int | None = None) -> bytes:
    """A regular file's bytes: measured (fstat) before a byte is read, and read no further than `limit` + 1
    (FileTooLarge past it, also for a file that grew meanwhile). What is not a regular file is an OSError, unread (a
    FIFO would block, a device never ends)."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO opens without waiting for a writer
    with os.fdopen(handle, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file: not read")
        if limit is not None and info.st_size > limit:
            raise FileTooLarge(info.st_size, limit)
        data = file.read() if limit is None else file.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise FileTooLarge(len(data), limit)
    return data


def path_refusals(files: list[ImageFile]) -> dict[str, list[str]]:
    """name -> [rule] of every file refused for where its manifest row points (judged before anything is read)."""
    return {f.name: [f.refusal] for f in files if f.refusal}


def is_packaged(source: str) -> bool:
    return source.startswith(PREFIX)


def is_image_source(source: str, path_column: str = "path") -> bool:
    """Images rather than a table: a packaged set, a folder holding image files, or a manifest naming them."""
    if is_packaged(source):
        return True
    path = Path(source)
    if path.is_dir():
        return any(p.suffix.lower() in SUFFIXES for p in path.rglob("*") if p.is_file())
    if path.suffix.lower() in MANIFEST_SUFFIXES and path.is_file():
        columns = _manifest_columns(path)
        return path_column in columns
    return False


def _manifest_columns(path: Path) -> list[str]:
    """The header only, and never an error: a file that is not a readable manifest (gzip bytes under a .csv name,
    a non-UTF-8 line) is a table, whose loader names its problems."""
    if path.suffix.lower() == ".csv":
        import csv

        with path.open("rb") as handle:
            first_line = handle.readline(65536).decode("utf-8-sig", errors="replace").rstrip("\r\n")
        try:
            return next(csv.reader([first_line]), [])
        except csv.Error:
            return []
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - not Parquet after all: the table loader says why
        return []


def list_images(source: str, target: str | None, path_column: str, rendered: int, seed: int,
                drift: float = 0.0) -> tuple[list[ImageFile], str]:
    """Every image of `source` with its label, and a name for messages."""
    if is_packaged(source):
        name = source.removeprefix(PREFIX)
        if name not in PACKAGED:
            raise ConfigError(f"data.source '{source}' is not a packaged image set; choose one of "
                              f"{', '.join(PREFIX + s for s in PACKAGED)}, or give a folder or a manifest.")
        pixels, labels = (packaged_digits() if name == "digits" else render_shapes(rendered, seed))
        if drift:
            pixels = shift_images(pixels, drift, seed)
        return [_in_memory(f"{name}/{i:05d}", label, image) for i, (image, label) in
                enumerate(zip(pixels, labels))], source
    path = Path(source)
    if path.is_dir():
        return folder_images(path), str(path)
    if not path.exists():
        raise DataError(f"{path} not found: give a folder of class subfolders, a manifest (CSV or Parquet with a "
                        f"'{path_column}' column), or a packaged set ({', '.join(PREFIX + s for s in PACKAGED)}).")
    return manifest_images(path, target, path_column), str(path)


def _in_memory(name: str, label: str, pixels: np.ndarray) -> ImageFile:
    data = encode_png(pixels)
    return ImageFile(name=name, label=label, read=lambda limit=None: data)


def _on_disk(name: str, label: str | None, path: Path) -> ImageFile:
    return ImageFile(name=name, label=label, read=lambda limit=None: read_capped(path, limit), path=path)


def folder_images(root: Path) -> list[ImageFile]:
    """ImageFolder: `root/<class>/**/<file>.png|jpg|jpeg`; hidden files and other suffixes are not images. A file
    directly in `root` belongs to no class (label None: the checks name it)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root)
        if path.suffix.lower() not in SUFFIXES or any(part.startswith(".") for part in relative.parts):
            continue
        label = relative.parts[0] if len(relative.parts) > 1 else None
        found.append(_on_disk(relative.as_posix(), label, path))
    if not found:
        raise DataError(f"{root} holds no PNG or JPEG files: the layout is {root}/<class>/<image>.png, one "
                        "subfolder per class.")
    return found


def manifest_images(manifest: Path, target: str | None, path_column: str,
                    labels_required: bool = True) -> list[ImageFile]:
    """A table of image paths (relative to the manifest's folder, or absolute inside it) and labels (without the
    label column, when not `labels_required`: images to score have none). A row whose path leaves the manifest's
    folder (`..`, an absolute path elsewhere, a symlink out of it) is refused by a named rule and never read."""
    import pandas as pd

    frame = pd.read_csv(manifest, dtype=str, keep_default_na=False) if manifest.suffix.lower() == ".csv" else \
        pd.read_parquet(manifest)
    if not labels_required and (target is None or target not in frame.columns):
        frame = frame.assign(**{target or "label": None})
        target = target or "label"
    missing = [c for c in (path_column, target) if c is None or c not in frame.columns]
    if missing:
        raise DataError(f"{manifest}: the manifest lacks column(s) {missing} (it has {list(frame.columns)}); it needs "
                        f"a path column (images.path_column, now '{path_column}') and the label column (data.target).")
    folder = manifest.parent.resolve()
    found = []
    for path, label in zip(frame[path_column].astype(str), frame[target]):
        text = None if label is None or (isinstance(label, float) and math.isnan(label)) or str(label) == "" \
            else str(label)
        file, refusal = manifest_file(folder, path)
        if refusal is not None:
            found.append(ImageFile(name=path, label=text, read=_refused(refusal), refusal=refusal))
            continue
        found.append(ImageFile(name=path, label=text, read=_reader(file, folder),
                               path=file if file.exists() else None))
    return found


def manifest_file(folder: Path, text: str) -> tuple[Path | None, str | None]:
    """(the file a manifest row names, resolved, None), or (None, the refusal naming its rule) when it resolves
    outside `folder` (the manifest's, resolved): through `..`, as an absolute path elsewhere, or by a symlink.
    Nothing is opened."""
    try:
        resolved = (folder / text).resolve()   # an absolute `text` replaces `folder`
    except (OSError, ValueError, RuntimeError) as exc:   # a NUL byte, a symlink loop
        return None, f"{UNUSABLE_PATH_RULE}: {text!r} cannot name a file ({type(exc).__name__}): not read"
    if not resolved.is_relative_to(folder):
        return None, (f"{OUTSIDE_MANIFEST_RULE}: {text!r} names a file outside the manifest's folder {folder}: "
                      "not read")
    return resolved, None


def _reader(path: Path, folder: Path) -> Callable[..., bytes]:
    def read(limit: int | None = None) -> bytes:
        if not path.resolve().is_relative_to(folder):   # swapped for a symlink out since the manifest was read
            raise PermissionError(f"{OUTSIDE_MANIFEST_RULE}: {path} now resolves outside {folder}: not read")
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        return read_capped(path, limit)   # a folder, a FIFO or a device: "not a regular file"

    return read


def _refused(refusal: str) -> Callable[..., bytes]:
    def read(limit: int | None = None) -> bytes:
        raise PermissionError(refusal)

    return read


def packaged_digits() -> tuple[np.ndarray, list[str]]:
    """scikit-learn's digits as (N, 8, 8, 1) uint8 (its 0..16 scaled to 0..255) and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).clip(0, 255).astype(np.uint8)[:, :, :, None]
    return pixels, [str(int(t)) for t in digits.target]


def render_shapes(count: int, seed: int, side: int = SHAPE_SIDE) -> tuple[np.ndarray, list[str]]:
    """(count, side, side, 3) uint8 noisy shapes, balanced over SHAPES, and their labels: a random position, size,
    colour and rotation on a dark noisy background."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    images = np.empty((count, side, side, 3), dtype=np.uint8)
    labels = [SHAPES[i % len(SHAPES)] for i in range(count)]
    for i, shape in enumerate(labels):
        background = rng.integers(0, 90, 3)
        canvas = Image.new("RGB", (side, side), tuple(int(v) for v in background))
        draw = ImageDraw.Draw(canvas)
        colour = tuple(int(v) for v in rng.integers(120, 256, 3))
        radius = rng.uniform(0.22, 0.38) * side
        cx, cy = rng.uniform(radius, side - radius, 2)
        angle = rng.uniform(0, 2 * math.pi)
        _draw(draw, shape, cx, cy, radius, angle, colour)
        noisy = np.asarray(canvas, dtype=np.int16) + rng.normal(0, 12, (side, side, 3)).round().astype(np.int16)
        images[i] = noisy.clip(0, 255).astype(np.uint8)
    return images, labels


def _draw(draw, shape: str, cx: float, cy: float, radius: float, angle: float, colour: tuple) -> None:
    def polygon(corners: int, offset: float) -> list[tuple[float, float]]:
        return [(cx + radius * math.cos(offset + 2 * math.pi * k / corners),
                 cy + radius * math.sin(offset + 2 * math.pi * k / corners)) for k in range(corners)]

    if shape == "circle":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=colour)
    elif shape == "square":
        draw.polygon(polygon(4, angle), fill=colour)
    elif shape == "triangle":
        draw.polygon(polygon(3, angle), fill=colour)
    else:   # a cross: two bars through the centre
        width = max(2.0, radius / 2.5)
        for bar in (angle, angle + math.pi / 2):
            dx, dy = math.cos(bar), math.sin(bar)
            px, py = -dy * width / 2, dx * width / 2
            ends = [(cx - dx * radius, cy - dy * radius), (cx + dx * radius, cy + dy * radius)]
            draw.polygon([(x + px, y + py) for x, y in ends] + [(x - px, y - py) for x, y in reversed(ends)],
                         fill=colour)


def shift_images(pixels: np.ndarray, drift: float, seed: int) -> np.ndarray:
    """A shifted stream of the same images, `drift` in [0, 1]: brighter (+80 levels at 1), noisier (sigma 30) and
    rotated (up to 20 degrees), so the image statistics and the model's embeddings move."""
    from PIL import Image

    rng = np.random.default_rng(seed + 1)
    shifted = np.empty_like(pixels)
    for i, image in enumerate(pixels):
        plane = image[:, :, 0] if image.shape[2] == 1 else image
        rotated = np.asarray(Image.fromarray(plane).rotate(float(rng.uniform(-20, 20) * drift)), dtype=np.float32)
        rotated = rotated[:, :, None] if rotated.ndim == 2 else rotated
        noisy = rotated + 80 * drift + rng.normal(0, 30 * drift, rotated.shape)
        shifted[i] = noisy.round().clip(0, 255).astype(np.uint8)
    return shifted


def _file_md5(path: Path) -> bytes:
    """A file's md5, read in blocks (never whole into memory)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "md5").digest()


def first_image_header(files: list[ImageFile], max_bytes: int, tries: int = 20) -> tuple[int, int, str]:
    """(width, height, Pillow mode) from the header of the first of `files` that opens as an image (what the own-module
    probe is sized by); a DataError naming the files tried and why when none of the first `tries` does (prepare then
    judges every file)."""
    import io

    from PIL import Image

    problems = []
    for file in files[:tries]:
        try:
            with Image.open(io.BytesIO(file.read_within(max_bytes))) as image:
                return image.width, image.height, image.mode
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
            problems.append(f"{file.name}: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}")
    raise DataError(f"none of the first {len(problems)} image file(s) of the source could be read as an image, so "
                    f"the model cannot be probed: {'; '.join(problems[:3])}. Fix or remove them (prepare names every "
                    "file and the rule it breaks).")


def check_image_source(source: str, target: str | None, path_column: str) -> None:
    """What prepare would refuse after a while, refused in a second: an unknown packaged set, a folder without
    images, a manifest without its path or label column (the files themselves are judged by prepare)."""
    if is_packaged(source):
        if source.removeprefix(PREFIX) not in PACKAGED:
            raise ConfigError(f"data.source '{source}' is not a packaged image set; choose one of "
                              f"{', '.join(PREFIX + s for s in PACKAGED)}, or give a folder or a manifest.")
        return
    path = Path(source)
    if path.is_dir():
        folder_images(path)
    elif path.is_file():
        columns = _manifest_columns(path)
        missing = [c for c in (path_column, target) if c not in columns]
        if missing:
            raise DataError(f"{path}: the manifest lacks column(s) {missing} (it has {columns}); it needs a path "
                            f"column (images.path_column, now '{path_column}') and the label column (data.target).")
    else:
        raise DataError(f"{path} not found: give a folder of class subfolders, a manifest, or a packaged set "
                        f"({', '.join(PREFIX + s for s in PACKAGED)}).")


def fingerprint_images(source: str, path_column: str, target: str | None) -> dict:
    """What identifies a source's images: a packaged set's name (its params are DVC params of prepare), else the
    md5 of every file's name and bytes (a manifest's own bytes too), so an edited image re-runs prepare."""
    if is_packaged(source):
        return {"source": source}
    path = Path(source)
    digest = hashlib.md5()
    if path.is_file():
        digest.update(path.read_bytes())
        files = [(f.name, f.path) for f in manifest_images(path, target, path_column)]
    else:
        files = [(f.name, f.path) for f in folder_images(path)] if path.is_dir() else []
    for name, file in files:
        digest.update(name.encode() + b"\0")
        digest.update(_file_md5(file) if file is not None and file.is_file() else b"-")
    return {"source": source, "md5": digest.hexdigest(), "files": len(files)}
