"""The tokenization gate: the served graph's token ids equal the training tokenizer's, on the holdout texts, on
adversarial strings and on the vocabulary in other cases, before any parity of logits is worth measuring. Training
and serving that tokenize differently answer wrong with no error; this is where it shows."""
from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tasks.core.gate import GateResult
from tasks.core.graph_nodes import MODEL
from tasks.core.runtime import open_onnx
from tasks.modalities.text.graph import IDS, TEXT_INPUT, text_feed
from tasks.modalities.text.tokenizer import Tokenizer

GATE = "tokenization"
CHUNK = 256      # texts per graph call
SHOWN = 3        # mismatching texts named in the reason
SHOWN_CHARS = 60
_WORD = "Café"
# Strings a tokenizer pair gets wrong first. No lone surrogate: it is not valid UTF-8, so it cannot travel in a JSON
# request (the service answers it with 422) nor enter an ONNX string tensor.
ADVERSARIAL: tuple[str, ...] = (
    "", " ", "   ", "\t", "\n", " \t\r\n\x0b\x0c ", "\u00a0\u2009\u3000",        # empty, whitespace only
    "tabs\tand\nnew\r\nlines", "a\u2028line\u2029separators\x85next",
    "😀", "great 👍🏽 product", "👨\u200d👩\u200d👧\u200d👦 family", "🏳️\u200d🌈", "❤️❤️ love", "🇫🇷🇯🇵 flags",
    "keycap 1️⃣ #️⃣",                                                            # emoji, ZWJ sequences, modifiers
    *(unicodedata.normalize(form, _WORD + " Ångström ﬁancé") for form in ("NFC", "NFD", "NFKC", "NFKD")),
    "zero\u200bwidth space", "zero\u200dwidth joiner", "zero\u200cwidth non-joiner", "\ufeffbyte order mark",
    "می\u200cخواهم", "मैं क्षत्रिय हूँ",                                       # joiners inside words
    "مرحبا بالعالم", "שָׁלוֹם עוֹלָם", "abc \u202edcba\u202c def", "rtl\u200fmark\u200e",   # right to left
    "Hello мир 世界 🌍 مرحبا שלום γειά", "日本語のテキスト、句読点。", "한국어 텍스트",            # mixed scripts
    "x" * 10_000, "word " * 2_000, "é" * 3_000 + "😀" * 3_000,                  # 10,000 characters and more
    "\x00nul\x01\x07bell\x1b[31mcolour\x7f", "\x1c\x1d\x1e\x1f separators",        # controls
    "ＦＵＬＬ ｗｉｄｔｈ １２３ ！？", "ﬁne ﬂow ﬀ ﬃ", "Ⅻ ⅻ ① ⓐ Ⓐ",          # full width, ligatures, compat forms
    "İstanbul ISTANBUL ıi İI", "STRASSE Straße STRAẞE ß ẞ", "ΣΊΣΥΦΟΣ ΑΣ σς", "ǅ ǈ ǋ Dž",   # special cases
    "e\u0301\u0301\u0301 stacked", "\u0301orphan mark", "Z\u0364\u0311a\u0308\u0347l\u036eg\u0328o zalgo",
    "𝐁𝐨𝐥𝐝 𝔉𝔯𝔞𝔨𝔱𝔲𝔯 𝟙𝟚𝟛", "\U000e0001\U000e0065\U000e006e tags", "\uf8ff private \U0010fffd",
    "don't stop-believing e-mail@example.com https://x.example/a?b=1&c=2", "1,000.50 $ € ¥ ½ ² 3/4",
    "!!!", "...", "A", "a", "I", "ABC abc AbC aBc",
)


def front_session(front_end: onnx.ModelProto | str | Path):
    """An ONNX Runtime session answering `text` -> ids: a standalone front end (output `ids`), or a composed served
    graph with the ids its model reads added as an output (its nodes unchanged)."""
    model = front_end if isinstance(front_end, onnx.ModelProto) else onnx.load(str(front_end))
    outputs = [o.name for o in model.graph.output]
    if [i.name for i in model.graph.input] != [TEXT_INPUT]:
        raise ValueError(f"the graph to gate must take the one input `{TEXT_INPUT}`")
    if IDS in outputs:
        return open_onnx(model.SerializeToString(), 1), IDS
    read = f"{MODEL}x"
    if not any(read in node.output for node in model.graph.node):
        raise ValueError(f"the graph has neither an `{IDS}` output nor a model input `{read}` to read the ids from")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.append(helper.make_tensor_value_info(read, TensorProto.INT64, None))
    return open_onnx(copy.SerializeToString(), 1), read


def case_probes(tokenizer: Tokenizer) -> list[str]:
    """The vocabulary upper-cased and title-cased, max_tokens words a text: where the graph's lower-casing (its host's
    C library) and the tokenizer's table differ on a letter that matters, the ids differ here."""
    if not tokenizer.lowercase:
        return []
    words = [variant for token in tokenizer.vocabulary for variant in (token.upper(), token.title())]
    step = tokenizer.max_tokens
    return [" ".join(words[i:i + step]) for i in range(0, len(words), step)]


def batches(holdout: Sequence[str], tokenizer: Tokenizer) -> Iterator[list[str]]:
    """What the gate feeds: the holdout and the case probes in chunks, the adversarial strings all together and one
    at a time (a row's padding depends on its batch), and a batch in which no text has a token."""
    for texts in (list(holdout), case_probes(tokenizer)):
        yield from (texts[i:i + CHUNK] for i in range(0, len(texts), CHUNK))
    yield list(ADVERSARIAL)
    yield from ([text] for text in ADVERSARIAL)
    yield ["", " ", "\t\n", "\u200b"]


def shown(text: str) -> str:
    """A mismatching text as a reason names it: repr, truncated, with its length when cut."""
    return repr(text) if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]!r}... ({len(text):,} characters)"


def tokenization_gate(tokenizer: Tokenizer, front_end: onnx.ModelProto | str | Path,
                      texts: Sequence[str]) -> GateResult:
    """Pass when the graph's ids equal `tokenizer.encode` on every text of the holdout `texts`, on ADVERSARIAL and on
    the case probes; fail naming the first few texts that differ (and where the graph refused a batch)."""
    session, output = front_session(front_end)
    wrong: list[str] = []
    refused: list[str] = []
    compared = 0
    for batch in batches(texts, tokenizer):
        try:
            got = session.run([output], text_feed(batch))[0]
        except Exception as exc:   # noqa: BLE001  ONNX Runtime raises its own types; the reason names it
            refused.append(f"the graph refused a batch of {len(batch)} starting {shown(batch[0])}: "
                           f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        expected = tokenizer.encode(batch)
        compared += len(batch)
        if got.shape != expected.shape:
            wrong.extend(batch)
            continue
        wrong.extend(text for text, row in zip(batch, (got != expected).any(axis=1)) if row)
    failures = refused[:SHOWN]
    if wrong:
        failures.append(f"{len(wrong):,} of {compared:,} texts get other token ids from the graph than from the "
                        f"training tokenizer, e.g. " + ", ".join(shown(text) for text in wrong[:SHOWN]))
    return GateResult.decide(GATE, failures, passed=f"the graph's token ids equal the training tokenizer's on "
                             f"{compared:,} texts ({len(texts):,} holdout, {len(ADVERSARIAL)} adversarial, "
                             f"the vocabulary upper- and title-cased)")
