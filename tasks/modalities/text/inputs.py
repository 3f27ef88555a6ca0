"""A text model's inputs as its schema carries them (`Schema.inputs`): the TextShape, the tokenizer's canonical JSON
and the most characters a text may hold. The schema is prepare's DVC output (its hash, and so the tokenizer's, is in
every version's lineage) and rides inside every exported graph's metadata: reading a split, composing the served
graph, scoring a bare variant and the service all rebuild the exact tokenizer from it. Nothing is fetched."""
from __future__ import annotations

from functools import lru_cache

from tasks.core.errors import DataError
from tasks.core.schema_spec import Schema
from tasks.modalities.text.spec import TextShape
from tasks.modalities.text.tokenizer import Tokenizer

TOKENIZER = "tokenizer"   # Schema.inputs key: the tokenizer's canonical JSON
MAX_CHARS = "max_chars"   # Schema.inputs key: the most characters a text of the training set could hold


def text_inputs(tokenizer: Tokenizer, column: str, max_chars: int) -> dict:
    """What a text schema's `inputs` hold."""
    return {**tokenizer.shape(column).model_dump(), TOKENIZER: tokenizer.to_json(), MAX_CHARS: max_chars}


def text_shape(schema: Schema) -> TextShape:
    """The schema's TextShape (refused, naming the schema's source, when it has none)."""
    try:
        return TextShape.model_validate({key: schema.inputs[key] for key in TextShape.model_fields
                                         if key in schema.inputs})
    except (KeyError, ValueError) as exc:
        raise DataError(f"the schema of {schema.source} describes no text model input ({exc})") from None


def schema_max_chars(schema: Schema) -> int:
    return int(schema.inputs[MAX_CHARS])


def schema_tokenizer(schema: Schema) -> Tokenizer:
    """The run's tokenizer, rebuilt from the schema and held to the sha256 its shape pins."""
    shape = text_shape(schema)
    tokenizer = _parsed(schema.inputs.get(TOKENIZER, ""))
    if tokenizer.sha256 != shape.tokenizer_sha256 or tokenizer.width != shape.width:
        raise DataError(f"the schema of {schema.source} carries a tokenizer of sha256 {tokenizer.sha256[:12]}..., "
                        f"not the {shape.tokenizer_sha256[:12]}... its shape pins: it was edited")
    return tokenizer


@lru_cache(maxsize=8)
def _parsed(text: str) -> Tokenizer:
    """A tokenizer's JSON parsed and checked once per process (a service scores many requests with one)."""
    return Tokenizer.from_json(text)
