"""Request texts checked against the model's own limits: the text modality's request decoder (the table one is
tasks/modalities/table/serving.py's RowDecoder, the image one ImageDecoder; this one has the same face: decode,
feed, features).

A request carries raw strings as JSON, `{"texts": ["...", ...]}`; the served graph tokenizes them itself (its front
end is the run's tokenizer as ONNX operators), so the service sends them as they came. The body's size is held to
`serve.max_body_mb` by the front; here: at least one text (an empty list is 422: the graph's StringNormalizer refuses
an empty batch), at most `text.max_texts` texts (413), each at most the model's own character limit (the longest text
its training set could hold, carried in its schema), tightened by the serving host's `text.max_chars` (413: the
graph's tokenizer holds N x the most tokens of any text of a batch, so a long text is what costs memory). A text
with a lone surrogate (valid JSON escapes, but no Unicode text: it cannot enter the graph as UTF-8) gets 422 naming
the text. Never a 5xx for what a client sent.

The request log keeps no raw text unless the host opts in (`text.log_raw`): per text its descriptors (characters,
words, non-letter share, out-of-vocabulary share against the run's own tokenizer) and the model's own embedding
projection, which the served graph outputs beside the probabilities."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import msgspec
import numpy as np

from tasks.core.refusals import BodyRefused, RowsRefused
from tasks.core.schema_spec import Schema
from tasks.modalities.text.descriptors import descriptor_row, lone_surrogate
from tasks.modalities.text.graph import TEXT_INPUT, text_feed
from tasks.modalities.text.inputs import schema_max_chars, schema_tokenizer, text_shape
from tasks.modalities.text.settings import TextParams

TEXTS_SHAPE = 'body must be {"texts": ["<a text>", ...]} with at least one text'
SHARE_DIGITS = 4   # of a logged share: drift tests need no more, and long floats lengthen every log line


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    texts: list[str]


@dataclass(frozen=True)
class TextLimits:
    """What one request may carry, and whether its texts are logged."""

    max_chars: int                 # characters per text
    chars_setting: str             # where that limit comes from, for the 413's words
    max_texts: int = 256           # texts per request (text.max_texts)
    log_raw: bool = False          # text.log_raw


def limits_for(schema: Schema, host: TextParams) -> TextLimits:
    """The model's own character limit (its schema's), only ever tightened by the serving host's `text.max_chars`."""
    chars = min((schema_max_chars(schema), "the model's training limit, from its schema"),
                (host.max_chars, "text.max_chars"), key=lambda c: c[0])
    return TextLimits(max_chars=chars[0], chars_setting=chars[1], max_texts=host.max_texts, log_raw=host.log_raw)


@dataclass
class TextRows:
    """Accepted texts of one request (or of a micro-batch) and what the request log keeps of each."""

    texts: list[str] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)

    def extend(self, other: TextRows) -> None:
        self.texts += other.texts
        self.stats += other.stats


def _problem(index: int, rule: str, message: str) -> dict:
    return {"row": index, "field": TEXT_INPUT, "rule": rule, "message": message}


class TextDecoder:
    """Body bytes -> accepted TextRows, or BodyRefused / RowsRefused; TextRows -> the served graph's feed
    ({"text": [N] strings})."""

    inline_body_bytes = 8 << 10   # decoded on the event loop up to this (a few short texts: well under a millisecond)

    def __init__(self, schema: Schema, limits: TextLimits):
        self.schema, self.limits = schema, limits
        self.tokenizer = schema_tokenizer(schema)
        self._decoder = msgspec.json.Decoder(_Body)

    def decode(self, body: bytes, content_type: str | None = None) -> TextRows:
        """The request's texts, checked; JSON whatever the content type says."""
        texts = self._texts(body)
        if not texts:
            raise BodyRefused(422, TEXTS_SHAPE)
        if len(texts) > self.limits.max_texts:
            raise BodyRefused(413, f"{len(texts):,} texts in one request: at most {self.limits.max_texts:,} "
                                   "(text.max_texts)")
        for index, text in enumerate(texts):
            if len(text) > self.limits.max_chars:
                raise BodyRefused(413, f"text {index}: {len(text):,} characters is over the limit of "
                                       f"{self.limits.max_chars:,} ({self.limits.chars_setting})")
        problems = [_problem(i, "unicode", why) for i, text in enumerate(texts) if (why := lone_surrogate(text))]
        if problems:
            raise RowsRefused(problems)
        return TextRows(texts, self._stats(texts))

    def _texts(self, body: bytes) -> list:
        """The body's texts: msgspec's parse, or (for what it refuses) Python's, which reads escaped lone surrogates
        so the check above can name them."""
        try:
            return self._decoder.decode(body).texts
        except msgspec.ValidationError as exc:
            raise BodyRefused(422, f"{TEXTS_SHAPE} ({exc})") from None
        except msgspec.DecodeError:
            pass
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BodyRefused(400, f"body is not valid JSON: {exc}") from None
        texts = parsed.get("texts") if isinstance(parsed, dict) else None
        if set(parsed if isinstance(parsed, dict) else ()) != {"texts"} or not isinstance(texts, list) \
                or not all(isinstance(text, str) for text in texts):
            raise BodyRefused(422, TEXTS_SHAPE)
        return texts

    def _stats(self, texts: list[str]) -> list[dict]:
        """Per text what the request log keeps: its descriptors (and the text itself where the host opted in)."""
        stats = [descriptor_row(text, self.tokenizer, SHARE_DIGITS) for text in texts]
        if self.limits.log_raw:
            for row, text in zip(stats, texts):
                row[TEXT_INPUT] = text
        return stats

    def feed(self, rows: TextRows) -> dict[str, np.ndarray]:
        return text_feed(rows.texts)

    def features(self, rows: TextRows, index: int) -> dict:
        """What the request log keeps of text `index` (its descriptors; never the text unless opted in)."""
        return rows.stats[index]

    def blank(self) -> TextRows:
        """One empty text (the warm-up: the graph answers a text without tokens)."""
        return TextRows([""], self._stats([""]))

    def empty(self) -> TextRows:
        """No texts yet (batch scoring fills it as it reads)."""
        return TextRows()

    def inputs(self) -> set[str]:
        """The served graph's one input: the strings."""
        return {TEXT_INPUT}

    def bare_inputs(self, rows: TextRows) -> np.ndarray:
        """What a bare text model takes: the run's tokenizer's ids (N, T) int64."""
        return self.tokenizer.encode(rows.texts)


class TextServing:
    """What the service takes of the text modality: its request decoding, its OpenAPI request, its batch scoring."""

    def decoder(self, schema: Schema, host: TextParams | None = None) -> TextDecoder:
        """Texts by the model's own limits (its schema's), which the serving host's `text` params may only tighten."""
        return TextDecoder(schema, limits_for(schema, host or TextParams()))

    def document(self, variant) -> dict:
        """/predict's request for a text version, and the wording of the answers that differ by modality."""
        limits, shape = variant.decoder.limits, text_shape(variant.schema)
        return {"description": f"Scores raw texts, tokenized inside the served graph by the run's own tokenizer "
                               f"({shape.vocab_size:,} ids, the first {shape.max_tokens} tokens of a text"
                               f"{f' and {shape.gram_slots} of its character n-grams' if shape.gram_slots else ''}"
                               f"{', lower-cased' if shape.lowercase else ''}). {TEXTS_SHAPE}.",
                "content": {"application/json": {"schema": {
                    "type": "object", "title": "PredictTexts", "required": ["texts"], "additionalProperties": False,
                    "properties": {"texts": {"type": "array", "minItems": 1, "maxItems": limits.max_texts, "items": {
                        "type": "string", "maxLength": limits.max_chars, "description": "a raw text (UTF-8)"}}}}}},
                "components": {}, "items": "text",
                "too_large": f"the body is over serve.max_body_mb, more than {limits.max_texts} texts "
                             f"(text.max_texts), or a text over {limits.max_chars:,} characters",
                "refused": "texts that break the rules (one problem per text: unicode), or a body of another shape "
                           "(an empty list included)"}

    def predict(self, source, output, variant, params, chunk: int, show_progress: bool = True):
        """`torchship predict`: a table with a text column, or a folder of .txt files, scored chunk by chunk."""
        from tasks.modalities.text.batch import predict_texts

        column = params.text.text_column or text_shape(variant.schema).column
        target = params.data.target or variant.schema.target   # the label column a scored file may hold
        return predict_texts(source, output, variant, column, target, chunk, show_progress)


SERVING = TextServing()
