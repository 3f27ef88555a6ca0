"""A split of texts on disk: one Parquet file (a DVC output of one object, pulled in a second), one row per text:
its name, the text itself, its label and the metadata the checks measured. The label column is always `label`
(whatever `data.target` is called: a source's own column named `text` or `name` cannot clash). The token ids are not
stored: every reader tokenizes with the schema's tokenizer (tasks/modalities/text/inputs.py), so a split never
disagrees with the tokenizer that reads it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tasks.core.artifacts import write_atomic

TEXT, LABEL = "text", "label"
METADATA = ("name", "chars", "tokens", "control_chars", "zero_width_chars", "non_letter_share", "sha256")


def write_split(path: Path, frame: pd.DataFrame) -> int:
    """Write a split (name, text, label and the METADATA columns) atomically; returns the texts written."""
    kept = frame[[c for c in (METADATA[0], TEXT, LABEL, *METADATA[1:]) if c in frame]].copy()
    kept[LABEL] = kept[LABEL].astype(str)
    write_atomic(path, lambda tmp: kept.to_parquet(tmp, index=False))
    return len(kept)


def read_texts(path: Path) -> list[str]:
    """The split's texts, in file order."""
    return pd.read_parquet(path, columns=[TEXT])[TEXT].tolist()


def read_metadata(path: Path) -> pd.DataFrame:
    """The split's label and metadata columns, without the texts."""
    import pyarrow.parquet as pq

    return pd.read_parquet(path, columns=[n for n in pq.read_schema(path).names if n != TEXT])
