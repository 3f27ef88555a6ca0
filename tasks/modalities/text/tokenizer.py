"""The run's tokenizer: fitted on the training split only, deterministic, written as canonical JSON and pinned by
its sha256, never fetched. Its rule is exactly what the served graph's ONNX operators compute
(tasks/modalities/text/graph.py), for every string:

1. lower-casing (optional), one code point at a time, by the table the artifact carries: the simple lower-case
   mapping ONNX Runtime's StringNormalizer applies (`towlower` of the C.UTF-8 locale), which is Python's
   `chr(c).lower()` wherever that is one character, and U+0130 (capital I with dot) -> "i". Never Python's
   `str.lower()` on a whole string: that maps a final capital sigma to "ς" and U+0130 to two code points;
2. tokens, left to right: a maximal run of word characters (letters, marks, numbers: Unicode categories L*, M*, N*),
   or a single character that is neither a word character nor skipped. Skipped characters (whitespace, controls,
   format characters such as zero-width joiners and bidirectional marks, variation selectors) only separate tokens.
   Both classes are explicit code point ranges carried in the artifact, so the rule is the same in Python's `re`
   and in RE2 (ONNX Runtime's Tokenizer) and does not move with either library's Unicode tables;
3. ids: 0 pads, 1 is an unknown token, then the vocabulary (most frequent first, ties in code point order); the first
   `max_tokens` tokens are kept, the rest truncated. No Unicode normalisation (stock ONNX has no operator for it):
   NFC and NFD forms of a word are different tokens, on both sides alike;
4. optionally, after the `max_tokens` word ids, `CharGrams.slots` ids of the lower-cased text's character n-grams
   (tasks/modalities/text/grams.py states their rule), ids after the words'."""
from __future__ import annotations

import hashlib
import itertools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from tasks.core.errors import DataError
from tasks.modalities.text.grams import CharGrams, fit_char_grams
from tasks.modalities.text.spec import TextShape

FORMAT = "torchship-text-tokenizer/1"
PAD, UNKNOWN, FIRST_WORD = 0, 1, 2   # ids
LAST_CODE_POINT = 0x10FFFF
MAX_VOCAB = 1_000_000   # a tokenizer file with more entries is refused (the graph holds one key per entry)
MAX_TOKENS = 4096
VARIATION_SELECTORS = ((0xFE00, 0xFE0F), (0xE0100, 0xE01EF))
Ranges = tuple[tuple[int, int], ...]


def code_point_ranges(member: Callable[[int], bool]) -> Ranges:
    """The inclusive ranges of code points for which `member` holds, in order."""
    found, start = [], None
    for code in range(LAST_CODE_POINT + 2):
        inside = code <= LAST_CODE_POINT and member(code)
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            found.append((start, code - 1))
            start = None
    return tuple(found)


@cache
def unicode_tables() -> tuple[Ranges, Ranges, Ranges]:
    """(word ranges, skipped ranges, lower-case pairs) from this Python's Unicode database: what a new tokenizer
    carries (an existing one keeps its own)."""
    chars = [chr(code) for code in range(LAST_CODE_POINT + 1)]
    categories = [unicodedata.category(char) for char in chars]
    selectors = {code for low, high in VARIATION_SELECTORS for code in range(low, high + 1)}
    skipped = [char.isspace() or category in ("Cc", "Cf") for char, category in zip(chars, categories)]
    for code in selectors:
        skipped[code] = True
    word = code_point_ranges(lambda code: categories[code][0] in "LMN" and not skipped[code])
    lowered = [char.lower() for char in chars]
    lower = [(code, ord(low)) for code, low in enumerate(lowered) if len(low) == 1 and low != chars[code]]
    lower.append((0x130, ord("i")))   # its full lower case is "i" + U+0307; towlower (and so ONNX Runtime) gives "i"
    return word, code_point_ranges(skipped.__getitem__), tuple(sorted(lower))


def character_class(ranges: Ranges, escape: Callable[[int], str], negate: bool = False) -> str:
    """A regex character class of exactly these code points, each written by `escape`."""
    body = "".join(escape(low) if low == high else f"{escape(low)}-{escape(high)}" for low, high in ranges)
    return f"[{'^' if negate else ''}{body}]"


def token_expression(word: Ranges, skip: Ranges, escape: Callable[[int], str]) -> str:
    """A word run, or one character that is neither a word character nor skipped: alternatives that never start on
    the same character, so leftmost-first (Python) and leftmost-longest (RE2 as ONNX Runtime sets it) agree."""
    return f"{character_class(word, escape)}+|{character_class(word + skip, escape, negate=True)}"


def python_escape(code: int) -> str:
    return f"\\U{code:08x}"


def re2_escape(code: int) -> str:
    return f"\\x{{{code:x}}}"


@dataclass(frozen=True)
class Tokenizer:
    """A fitted tokenizer (module docstring: the rule). Build with `fit_tokenizer` or `Tokenizer.from_json`."""

    vocabulary: tuple[str, ...]   # id FIRST_WORD + i
    max_tokens: int
    lowercase: bool
    word: Ranges
    skip: Ranges
    lower: Ranges                 # (code point, its lower case); empty when not lower-casing
    min_count: int = 1
    max_vocab: int = MAX_VOCAB
    grams: CharGrams | None = None   # character n-grams after the words, if any

    @property
    def vocab_size(self) -> int:
        """Every id a model may see: padding, unknown, the words, the character n-grams."""
        return FIRST_WORD + len(self.vocabulary) + (len(self.grams.vocabulary) if self.grams else 0)

    @property
    def width(self) -> int:
        """Ids per text: max_tokens words, then the character n-grams' slots."""
        return self.max_tokens + (self.grams.slots if self.grams else 0)

    @cached_property
    def _pattern(self) -> re.Pattern:
        return re.compile(token_expression(self.word, self.skip, python_escape))

    @cached_property
    def _table(self) -> dict[int, int]:
        return dict(self.lower)

    @cached_property
    def _ids(self) -> dict[str, int]:
        return {token: FIRST_WORD + index for index, token in enumerate(self.vocabulary)}

    def re2_expression(self) -> str:
        """The token rule as the RE2 pattern the graph's Tokenizer runs."""
        return token_expression(self.word, self.skip, re2_escape)

    def tokens(self, text: str, limit: int | None = None) -> list[str]:
        """The text's tokens, in order (the first `limit` only, when given)."""
        if not isinstance(text, str):
            raise TypeError(f"a text must be a str, not {type(text).__name__}")
        return self._cased_tokens(self.cased(text), limit)

    def _cased_tokens(self, cased: str, limit: int | None = None) -> list[str]:
        return [match.group() for match in itertools.islice(self._pattern.finditer(cased), limit)]

    def cased(self, text: str) -> str:
        """The text lower-cased by the tokenizer's table (as it is when not lower-casing)."""
        return text.translate(self._table) if self.lowercase else text

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, width) int64 ids: the first max_tokens tokens of each text, padded with PAD, then its character
        n-grams' ids (if any), padded with PAD."""
        ids = np.full((len(texts), self.width), PAD, dtype=np.int64)
        lookup = self._ids
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"a text must be a str, not {type(text).__name__}")
            cased = self.cased(text)   # once: the words and the grams both read it
            found = [lookup.get(token, UNKNOWN) for token in self._cased_tokens(cased, self.max_tokens)]
            ids[row, :len(found)] = found
            if self.grams:
                found = self.grams.ids(cased)
                ids[row, self.max_tokens:self.max_tokens + len(found)] = found
        return ids

    def unknown_shares(self, texts: Iterable[str]) -> np.ndarray:
        """Per text, the share of its tokens (all of them, not only the kept ones) outside the vocabulary; 0 for a
        text without tokens."""
        shares = []
        for text in texts:
            tokens = self.tokens(text)
            shares.append(sum(token not in self._ids for token in tokens) / len(tokens) if tokens else 0.0)
        return np.asarray(shares, dtype=np.float64)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "vocabulary": list(self.vocabulary), "max_tokens": self.max_tokens,
                "lowercase": self.lowercase, "min_count": self.min_count, "max_vocab": self.max_vocab,
                "word": [list(r) for r in self.word], "skip": [list(r) for r in self.skip],
                "lower": [list(p) for p in self.lower],
                **({"char_grams": self.grams.to_dict()} if self.grams else {})}

    def to_json(self) -> str:
        """The canonical JSON (sorted keys, no spaces, ASCII): what is written and hashed."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode("ascii")).hexdigest()

    def shape(self, column: str) -> TextShape:
        """The schema's description of a model that reads `column` through this tokenizer."""
        return TextShape(column=column, max_tokens=self.max_tokens, vocab_size=self.vocab_size,
                         lowercase=self.lowercase, tokenizer_sha256=self.sha256,
                         gram_slots=self.grams.slots if self.grams else 0)

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """A tokenizer written by `to_json`, checked rule by rule (a broken or hand-edited file names its fault)."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise DataError(f"not a torchship tokenizer (format {FORMAT!r} expected)")
            if not isinstance(data["lowercase"], bool) or not all(isinstance(t, str) for t in data["vocabulary"]):
                raise TypeError("`lowercase` must be true or false and every vocabulary entry a string")
            vocabulary = tuple(data["vocabulary"])
            grams = data.get("char_grams")
            found = cls(vocabulary, int(data["max_tokens"]), data["lowercase"],
                        _ranges(data["word"]), _ranges(data["skip"]), _ranges(data["lower"], pairs=True),
                        int(data["min_count"]), int(data["max_vocab"]),
                        CharGrams.from_dict(grams, FIRST_WORD + len(vocabulary)) if grams is not None else None)
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"tokenizer file unreadable: {exc}") from None
        found.check()
        return found

    def check(self) -> None:
        """Refuse a tokenizer the graph could not reproduce: bad sizes, overlapping classes, a vocabulary entry that
        is not one token of its own rule (or is there twice)."""
        if not 0 < self.max_tokens <= MAX_TOKENS or not 0 < len(self.vocabulary) <= MAX_VOCAB:
            raise DataError(f"tokenizer: max_tokens {self.max_tokens} must be in 1..{MAX_TOKENS} and the vocabulary "
                            f"hold 1..{MAX_VOCAB} entries ({len(self.vocabulary)})")
        covered = sorted(self.word + self.skip)
        if any(a[1] >= b[0] for a, b in zip(covered, covered[1:])):
            raise DataError("tokenizer: the word and skipped character ranges overlap")
        if len(set(self.vocabulary)) != len(self.vocabulary):
            raise DataError("tokenizer: a vocabulary entry is there twice")
        bad = next((token for token in self.vocabulary if self.tokens(token) != [token]), None)
        if bad is not None:
            raise DataError(f"tokenizer: vocabulary entry {bad[:40]!r} is not one token of the tokenizer's own rule")
        if self.grams:
            self.grams.check()
            if self.grams.first_id != FIRST_WORD + len(self.vocabulary):
                raise DataError("tokenizer: the character n-grams' ids must follow the words'")


def _ranges(rows: list, pairs: bool = False) -> Ranges:
    """Ranges (or lower-case pairs) read from JSON: two code points each, ascending where they are ranges."""
    found = tuple((int(low), int(high)) for low, high in rows)
    if any(not 0 <= v <= LAST_CODE_POINT for row in found for v in row) or \
            (not pairs and any(low > high for low, high in found)):
        raise ValueError(f"code point {'pairs' if pairs else 'ranges'} out of order or outside 0..0x10FFFF")
    return found


def fit_tokenizer(texts: Iterable[str], max_tokens: int, lowercase: bool = True, min_count: int = 1,
                  max_vocab: int = 20_000, grams: dict | None = None) -> Tokenizer:
    """The vocabulary of the training texts: tokens seen at least `min_count` times, the `max_vocab` most frequent
    (ties in code point order), by the rule of the module docstring; with `grams` (`fit_char_grams`' low, high,
    chars, slots, min_count and max_grams), their character n-grams after the words."""
    if not 0 < max_tokens <= MAX_TOKENS:
        raise DataError(f"max_tokens {max_tokens} must be in 1..{MAX_TOKENS}")
    if min_count < 1 or not 0 < max_vocab <= MAX_VOCAB:
        raise DataError(f"min_count {min_count} must be at least 1 and max_vocab {max_vocab} in 1..{MAX_VOCAB}")
    word, skip, lower = unicode_tables()
    rule = Tokenizer((), max_tokens, lowercase, word, skip, lower if lowercase else ())
    texts = list(texts)
    counts = Counter(token for text in texts for token in rule.tokens(text))
    ranked = sorted((item for item in counts.items() if item[1] >= min_count), key=lambda item: (-item[1], item[0]))
    if not ranked:
        raise DataError(f"the training texts hold no token seen at least {min_count} times: nothing to learn from")
    vocabulary = tuple(token for token, _ in ranked[:max_vocab])
    fitted_grams = fit_char_grams((rule.cased(text) for text in texts), first_id=FIRST_WORD + len(vocabulary),
                                  **grams) if grams else None
    return Tokenizer(vocabulary, max_tokens, lowercase, word, skip, rule.lower, min_count, max_vocab, fitted_grams)
