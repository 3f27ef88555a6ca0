"""md5 fingerprints of data files: what `data/source.json` holds so that DVC sees a changed source or a new
accepted batch (tasks/modalities/sources.py writes it)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from tasks.core import paths


def md5_of(path: Path) -> str:
    """A file's md5; a folder's (a partitioned Parquet data set) is the md5 of its files' names and md5s."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        listing = "".join(f"{p.relative_to(path).as_posix()} {md5_of(p)}\n" for p in files)
        return hashlib.md5(listing.encode()).hexdigest()
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "md5").hexdigest()


def batch_fingerprints() -> dict[str, str]:
    """name -> md5 of every batch `torchship ingest` accepted into data/batches/."""
    return {batch.name: md5_of(batch) for batch in sorted(paths.BATCHES.glob("*.parquet"))}
