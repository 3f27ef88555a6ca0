"""Character n-grams: the part of a tokenizer that reads a text below its words. Tweets and other short, noisy texts
carry much of their signal in spelling, elongation, emoticons and punctuation runs ("sooo", ":-(", "!!!"), which a
word vocabulary counts as unknown or splits apart; TF-IDF baselines read them through character n-grams, and so does
the bag (bench/results/text.json). Fitted on the training split with the words, carried in the same artifact, and
computed by the served graph with stock operators (tasks/modalities/text/graph.py `gram_nodes`).

The rule, per text, after the tokenizer's own lower-casing:
1. its first `chars` code points (a bound on the work a 20,000-character text costs, in Python and in the graph);
2. every substring of `low`..`high` code points, the shortest first and each size left to right, spaces and
   punctuation included;
3. those in the vocabulary, as ids (the first `slots` of them; the rest dropped), padded with 0. A gram outside the
   vocabulary is dropped, not unknown: it says nothing a model could learn."""
from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

from tasks.core.errors import DataError

MAX_CHARS = 1000   # RE2's largest counted repetition: the graph cuts a text's prefix with `.{1,chars}`
MAX_SIZE = 8
MAX_GRAMS = 1_000_000   # a file with more is refused (the graph holds one LabelEncoder key per gram)


@dataclass(frozen=True)
class CharGrams:
    """A fitted character n-gram vocabulary (module docstring: the rule); ids first_id + i."""

    vocabulary: tuple[str, ...]
    low: int
    high: int
    chars: int
    slots: int
    first_id: int

    @cached_property
    def _ids(self) -> dict[str, int]:
        return {gram: self.first_id + index for index, gram in enumerate(self.vocabulary)}

    def ids(self, cased: str) -> list[int]:
        """The ids of an already lower-cased text (its first `slots`)."""
        lookup = self._ids
        found = (lookup.get(gram, 0) for gram in substrings(cased[:self.chars], self.low, self.high))
        return list(itertools.islice((i for i in found if i), self.slots))

    def to_dict(self) -> dict:
        return {"vocabulary": list(self.vocabulary), "sizes": [self.low, self.high], "chars": self.chars,
                "slots": self.slots}

    @classmethod
    def from_dict(cls, data: dict, first_id: int) -> CharGrams:
        low, high = (int(size) for size in data["sizes"])
        if not all(isinstance(gram, str) for gram in data["vocabulary"]):
            raise TypeError("every character n-gram must be a string")
        found = cls(tuple(data["vocabulary"]), low, high, int(data["chars"]), int(data["slots"]), first_id)
        found.check()
        return found

    def check(self) -> None:
        """Refuse what the graph could not reproduce: sizes out of range, a prefix RE2 cannot cut, a gram of
        another size, a gram twice."""
        if not 1 <= self.low <= self.high <= MAX_SIZE or not self.high <= self.chars <= MAX_CHARS \
                or not 0 < self.slots <= 65_536 or not 0 < len(self.vocabulary) <= MAX_GRAMS:
            raise DataError(f"tokenizer: character n-grams of {self.low}..{self.high} (at most {MAX_SIZE}) over the "
                            f"first {self.chars} characters (at most {MAX_CHARS}), {self.slots} per text and a "
                            f"vocabulary of 1..{MAX_GRAMS:,} ({len(self.vocabulary):,}) are required")
        if len(set(self.vocabulary)) != len(self.vocabulary):
            raise DataError("tokenizer: a character n-gram is there twice")
        bad = next((gram for gram in self.vocabulary if not self.low <= len(gram) <= self.high), None)
        if bad is not None:
            raise DataError(f"tokenizer: character n-gram {bad!r} is not {self.low}..{self.high} characters long")


def substrings(text: str, low: int, high: int) -> Iterator[str]:
    """Every substring of low..high code points: the shortest first, each size left to right."""
    for size in range(low, high + 1):
        for start in range(len(text) - size + 1):
            yield text[start:start + size]


def fit_char_grams(cased: Iterable[str], low: int, high: int, chars: int, slots: int, min_count: int,
                   max_grams: int, first_id: int) -> CharGrams | None:
    """The grams of the (lower-cased) training texts seen at least `min_count` times, the `max_grams` most frequent
    (ties in code point order); None when none is."""
    counts = Counter(gram for text in cased for gram in substrings(text[:chars], low, high))
    ranked = sorted((item for item in counts.items() if item[1] >= min_count), key=lambda item: (-item[1], item[0]))
    if not ranked:
        return None
    found = CharGrams(tuple(gram for gram, _ in ranked[:max_grams]), low, high, chars, slots, first_id)
    found.check()
    return found
