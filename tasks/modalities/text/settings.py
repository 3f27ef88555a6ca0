"""The text modality's params section (`text:` in params.yaml): how texts are read and, without a declared text
contract, what every text must be. A spec: fields, defaults and their checks."""
from __future__ import annotations

from pydantic import Field, model_validator

from tasks.core.params_spec import Section


class TextTokenizer(Section):
    """The run's tokenizer, fitted on the training split by prepare and carried in the schema (and so inside every
    exported graph): tasks/modalities/text/tokenizer.py states its rule."""

    tokens_per_text: int = Field(128, ge=1, le=4096, description="Token ids the model reads per text: a longer text "
                                                                  "is truncated, a shorter one padded.")
    lowercase: bool = Field(True, description="Lower-case each code point before tokenizing (in prepare and inside "
                                              "the served graph alike).")
    min_count: int = Field(2, ge=1, description="A token seen fewer times in the training split is unknown (id 1).")
    max_vocab: int = Field(20_000, ge=1, le=1_000_000, description="The most frequent training tokens kept.")
    char_grams: tuple[int, int] | None = Field((3, 5), description="Character n-grams of these sizes (shortest, "
                                               "longest) after the words, which the bag reads (the Transformer reads "
                                               "words only): spelling, elongation and punctuation runs that a word "
                                               "vocabulary misses (tasks/modalities/text/grams.py). null = words "
                                               "only.")
    gram_chars: int = Field(256, ge=1, le=1000, description="Character n-grams are read from a text's first this "
                                                            "many characters.")
    gram_slots: int = Field(384, ge=1, le=65_536, description="Character n-gram ids a model reads per text: the "
                                                              "first this many found in the vocabulary.")
    gram_min_count: int = Field(2, ge=1, description="A character n-gram seen fewer times in the training split is "
                                                     "dropped.")
    max_grams: int = Field(100_000, ge=1, le=1_000_000, description="The most frequent training character n-grams "
                                                                    "kept.")

    @model_validator(mode="after")
    def _gram_sizes(self):
        if self.char_grams and not 1 <= self.char_grams[0] <= self.char_grams[1] <= min(8, self.gram_chars):
            raise ValueError(f"char_grams {list(self.char_grams)}: sizes 1 <= shortest <= longest <= 8, and no "
                             f"longer than gram_chars ({self.gram_chars})")
        return self

    def gram_settings(self) -> dict | None:
        """`fit_tokenizer`'s grams argument (None: words only)."""
        if not self.char_grams:
            return None
        low, high = self.char_grams
        return {"low": low, "high": high, "chars": self.gram_chars, "slots": self.gram_slots,
                "min_count": self.gram_min_count, "max_grams": self.max_grams}


class TextParams(Section):
    """The text modality: which column holds the text, what is read at all, the rules without a contract, the
    tokenizer, and what one request to the service may carry."""

    text_column: str | None = Field(None, description="A table's column of free text. null = the contract's, else "
                                                      "the one column that looks like free text (several: refused, "
                                                      "name one).")
    generated: int = Field(8000, ge=100, le=1_000_000, description="Texts `text:tickets` generates.")
    max_chars: int = Field(20_000, ge=1, description="A longer text is refused; one over 4 bytes a character is "
                                                     "refused unread (here and in the service).")
    min_chars: int = Field(1, ge=0, description="Without a contract: a shorter text is refused.")
    max_tokens: int | None = Field(None, ge=1, description="Without a contract: more whitespace-separated tokens are "
                                                           "refused. null = no limit beyond max_chars.")
    max_control_chars: int = Field(0, ge=0, description="Without a contract: control characters (not tab or line "
                                                        "breaks) a text may hold.")
    max_zero_width_chars: int = Field(8, ge=0, description="Without a contract: invisible format characters (zero-"
                                                           "width, bidi controls) a text may hold; emoji sequences "
                                                           "use zero-width joiners.")
    max_non_letter_share: float = Field(0.9, ge=0.0, le=1.0, description="Without a contract: the share of non-"
                                                                         "space characters that are not letters.")
    allow_duplicates: bool = Field(False, description="Without a contract: keep exact copies (after Unicode and "
                                                      "whitespace normalisation); false refuses every copy but the "
                                                      "first.")
    near_duplicate_jaccard: float = Field(0.8, gt=0.0, le=1.0, description="Two texts whose word-pair sets overlap "
                                                                           "this much (Jaccard) are near duplicates: "
                                                                           "one in another split is leakage.")
    max_class_ratio: float = Field(10.0, gt=1.0, description="A class holding this many times the median share of "
                                                             "the others is named in a warning.")
    max_bad_share: float = Field(0.05, ge=0.0, le=1.0, description="Without a contract: the share of texts that "
                                                                   "may be refused (each named, all quarantined) "
                                                                   "while the run goes on; above it, prepare fails.")
    tokenizer: TextTokenizer = TextTokenizer()
    transformer_min_rows: int = Field(50_000, ge=0, description="`train.model: auto` trains the Transformer from this "
                                                                "many training texts, the bag of n-grams below it: "
                                                                "on a CPU the bag trains in a fraction of the "
                                                                "Transformer's time (bench/results/text.json); the "
                                                                "size from which the Transformer pays is not yet "
                                                                "measured, so the bar is set high.")
    max_texts: int = Field(256, ge=1, description="The most texts one request to the service may carry (413 above).")
    log_raw: bool = Field(False, description="Keep each served text in the request log. Off: the log keeps its "
                                             "descriptors and the model's embedding projection only.")
