"""The declared text contract (the `contract:` section of params.yaml with `modality: text`): what every text of the
set may be. `suggest_text_contract` proposes one from reference texts; a person reviews it. Without one, the rules
come from the `text` params and the set itself (tasks/modalities/text/checks.py rules_for). A spec: fields and their
checks, and the suggestion from measured texts."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.modalities.text.descriptors import CONTROL, ZERO_WIDTH, non_letter_share


class TextContract(BaseModel):
    """Per set: its classes, text column, how many texts and what share may be refused; per text: length in
    characters and tokens, invisible and control characters, non-letter share; across texts: copies and leakage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    modality: Literal["text"]
    classes: list[str] = Field(min_length=2, description="The labels there may be: a text of another class is "
                                                         "refused.")
    text_column: str | None = Field(None, description="A table's column of free text (null: detected).")
    min_chars: int = Field(1, ge=0)
    max_chars: int = Field(20_000, ge=1)
    min_tokens: int = Field(1, ge=0, description="Whitespace-separated tokens at least.")
    max_tokens: int | None = Field(None, ge=1)
    max_control_chars: int = Field(0, ge=0, description="Control characters (not tab or line breaks) at most.")
    max_zero_width_chars: int = Field(8, ge=0, description="Invisible format characters (zero-width, bidi controls) "
                                                          "at most.")
    max_non_letter_share: float = Field(0.9, ge=0.0, le=1.0, allow_inf_nan=False)
    allow_duplicates: bool = Field(False, description="Keep exact copies (after NFKC and whitespace normalisation).")
    near_duplicate_jaccard: float = Field(0.8, gt=0.0, le=1.0, allow_inf_nan=False,
                                          description="Word-pair Jaccard from which a text in another split is a "
                                                      "near copy (leakage).")
    min_texts: int = Field(1, ge=1)
    min_class_share: float = Field(0.0, ge=0.0, lt=1.0)
    max_class_ratio: float = Field(10.0, gt=1.0, allow_inf_nan=False,
                                   description="A class holding this many times the median share of the others is "
                                               "named in a warning.")
    max_bad_share: float = Field(0.05, ge=0.0, le=1.0, description="Share of texts that may be refused (and "
                                                                   "quarantined) while the run goes on.")

    @model_validator(mode="after")
    def _ordered(self) -> TextContract:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars {self.min_chars} is above max_chars {self.max_chars}: no text could pass")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} is above max_tokens {self.max_tokens}: no text could pass")
        return self


def class_ratio(labels: Sequence[str]) -> tuple[str, float]:
    """The largest class and its share over the median share of the others (1.0 for one class)."""
    counts = Counter(labels).most_common()
    if len(counts) < 2:
        return (counts[0][0] if counts else ""), 1.0
    others = sorted(count for _, count in counts[1:])
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    return counts[0][0], counts[0][1] / median


def suggest_text_contract(texts: Sequence[str | None], labels: Sequence[str | None], margin: float = 0.1,
                          text_column: str | None = None) -> TextContract:
    """A contract that accepts every non-blank decodable text of the reference (None: not decodable): its observed
    classes, and each range widened by `margin` beyond the observed minimum and maximum (never a quantile, so no
    reference text is refused); a starting point to review."""
    kept = [t for t in texts if t is not None and t.strip()]
    classes = sorted({str(label) for label in labels if label is not None})
    if not kept:
        raise ValueError("no decodable, non-blank text to profile")
    chars = [len(t) for t in kept]
    tokens = [len(t.split()) for t in kept]

    def wider(values: list[int]) -> tuple[int, int]:
        return math.floor(min(values) * (1 - margin)), math.ceil(max(values) * (1 + margin))

    def ceiling(value: float) -> int:
        return math.ceil(value * (1 + margin))

    min_chars, max_chars = wider(chars)
    min_tokens, max_tokens = wider(tokens)
    share = max(non_letter_share(t) for t in kept)
    _, ratio = class_ratio([str(label) for label in labels if label is not None])
    return TextContract(modality="text", classes=classes, text_column=text_column,
                        min_chars=max(1, min_chars), max_chars=max(1, max_chars), min_tokens=max(1, min_tokens),
                        max_tokens=max(1, max_tokens),
                        max_control_chars=ceiling(max(len(CONTROL.findall(t)) for t in kept)),
                        max_zero_width_chars=ceiling(max(len(ZERO_WIDTH.findall(t)) for t in kept)),
                        max_non_letter_share=min(1.0, math.ceil(share * (1 + margin) * 10_000) / 10_000),
                        min_texts=max(1, int(len(kept) * (1 - margin))),
                        max_class_ratio=max(10.0, math.ceil(ratio * (1 + margin) * 100) / 100))
