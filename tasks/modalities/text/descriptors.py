"""What can be measured of a text without a model, a lexicon or a download: the per-text statistics the checks
judge (tasks/modalities/text/checks.py) and the descriptors the monitor watches, since the request log keeps no raw
text by default.

Offline by construction: plain regular expressions and the run's own vocabulary (the training split's words). Never
Evidently's `Sentiment`, `OOVWordsPercentage` or lemmatizing word matchers: they call `nltk.download` at run time.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

import numpy as np
import pandas as pd

DESCRIPTORS = ("chars", "words", "non_letter_share", "oov_share")
WORD = re.compile(r"\w+")                         # a word: a run of letters, digits or underscores (any script)
LETTER = re.compile(r"[^\W\d_]")                  # a letter of any script
SPACE = re.compile(r"\s")
# C0 and C1 controls except tab, line feed and carriage return (which text holds legitimately)
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# invisible format characters: soft hyphen, zero-width space/joiners/marks, bidi embeddings and isolates, word
# joiner, byte-order mark (a zero-width joiner also glues emoji sequences, so a contract allows a few)
ZERO_WIDTH = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def words_of(text: str) -> list[str]:
    """The text's words, case-folded: what the vocabulary and the out-of-vocabulary share count."""
    return WORD.findall(text.casefold())


def non_letter_share(text: str) -> float:
    """Share of the non-space characters that are not letters (digits, punctuation, symbols, emoji); 0 for none."""
    visible = len(text) - len(SPACE.findall(text))
    return 0.0 if visible == 0 else 1.0 - len(LETTER.findall(text)) / visible


def vocabulary_of(texts: Iterable[str], min_count: int = 1, max_size: int | None = None) -> frozenset[str]:
    """The run's own vocabulary: the words seen at least `min_count` times, the `max_size` most frequent kept."""
    counts = Counter(word for text in texts for word in words_of(text))
    common = [word for word, count in counts.most_common(max_size) if count >= min_count]
    return frozenset(common)


def oov_share(words: Sequence[str], vocabulary: Collection[str]) -> float:
    """Share of `words` outside `vocabulary`; 0 for a text without words."""
    return 0.0 if not words else sum(word not in vocabulary for word in words) / len(words)


def text_descriptors(texts: Sequence[str], vocabulary: Collection[str] | None = None) -> pd.DataFrame:
    """One row per text: length in characters, word count, non-letter share, and the out-of-vocabulary share
    against `vocabulary` (NaN without one)."""
    rows = np.empty((len(texts), len(DESCRIPTORS)), dtype=np.float64)
    for i, text in enumerate(texts):
        words = words_of(text)
        rows[i] = (len(text), len(words), non_letter_share(text),
                   np.nan if vocabulary is None else oov_share(words, vocabulary))
    frame = pd.DataFrame(rows, columns=list(DESCRIPTORS))
    return frame.astype({"chars": np.int64, "words": np.int64})


def lone_surrogate(text: str) -> str | None:
    """Where a text holds a lone surrogate (no Unicode character: not encodable as UTF-8), in words; None if none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}: not Unicode text"
    return None


def descriptor_row(text: str, tokenizer, digits: int | None = None) -> dict[str, int | float]:
    """One text's descriptors with the out-of-vocabulary share read by the run's own tokenizer (a Tokenizer): the
    share of its tokens the model reads as unknown; the shares rounded to `digits` (as numpy rounds) when given.
    Plain numbers: the service logs one row per text, and a DataFrame per request cost it more than the model."""
    words = words_of(text)
    shares = (non_letter_share(text), float(tokenizer.unknown_shares([text])[0]))
    if digits is not None:
        shares = tuple(float(np.round(share, digits)) for share in shares)
    return {"chars": len(text), "words": len(words), "non_letter_share": shares[0], "oov_share": shares[1]}


def model_descriptors(texts: Sequence[str], tokenizer) -> pd.DataFrame:
    """`descriptor_row` of every text, one row each: what the service logs of each text and what the monitor's
    reference holds, computed alike on both sides."""
    frame = pd.DataFrame([descriptor_row(text, tokenizer) for text in texts], columns=list(DESCRIPTORS))
    return frame.astype({"chars": np.int64, "words": np.int64, "non_letter_share": np.float64,
                         "oov_share": np.float64})
