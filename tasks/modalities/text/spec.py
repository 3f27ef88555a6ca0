"""What a text model takes: one raw text column, tokenized inside the served graph by the run's own tokenizer. A spec:
fields and parsing, no project imports."""
from __future__ import annotations

from pydantic import BaseModel, Field


class TextShape(BaseModel):
    """The text a model reads: which raw column, how many token ids per text (longer texts are truncated, shorter ones
    padded with id 0), the id range, and the tokenizer artifact that defines both (pinned by the sha256 of its
    canonical JSON); optionally character n-gram ids after the words. The served graph's input is always the string
    tensor `text`, whatever the column's name."""

    column: str
    max_tokens: int = Field(gt=0)
    vocab_size: int = Field(gt=2)   # ids 0..vocab_size-1: 0 padding, 1 unknown, the words, the character n-grams
    lowercase: bool
    tokenizer_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    gram_slots: int = Field(0, ge=0)   # character n-gram ids after the max_tokens word ids (0: none)

    @property
    def width(self) -> int:
        """Ids per text: the words, then the character n-grams."""
        return self.max_tokens + self.gram_slots
