"""The run's tokenizer: its rule (per code point lower-casing, word runs and single symbols), its ids, and its
artifact (deterministic, canonical JSON round trip, a hand-broken file refused). The graph's side of the same rule
is tests/model/test_text_graph.py."""
from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

from tasks.core.errors import DataError
from tasks.modalities.text.tokenizer import FIRST_WORD, PAD, UNKNOWN, Tokenizer, fit_tokenizer

TRAIN = ["the cat sat on the mat", "The dog ate the cat's food!", "a dog, a cat; a bird?", "Birds fly. Cats don't."]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return fit_tokenizer(TRAIN, max_tokens=6)


def test_ids_count_from_two_most_frequent_first_ties_in_code_point_order(tokenizer):
    counts: dict[str, int] = {}
    for text in TRAIN:
        for token in tokenizer.tokens(text):
            counts[token] = counts.get(token, 0) + 1
    assert tokenizer.vocabulary[:3] == ("the", "a", "cat")     # 4, 3 and 3 times: "a" < "cat"
    ranked = [counts[token] for token in tokenizer.vocabulary]
    assert ranked == sorted(ranked, reverse=True) and len(tokenizer.vocabulary) == len(counts)
    assert tokenizer.vocab_size == FIRST_WORD + len(counts)
    ids = tokenizer.encode(["the cat", "zebra the", ""])
    assert ids.dtype == np.int64 and ids.shape == (3, 6)
    assert ids.tolist() == [[FIRST_WORD, FIRST_WORD + 2, PAD, PAD, PAD, PAD],
                            [UNKNOWN, FIRST_WORD, PAD, PAD, PAD, PAD], [PAD] * 6]


def test_texts_are_truncated_to_max_tokens(tokenizer):
    ids = tokenizer.encode(["a " * 50 + "the"])
    assert ids.tolist() == [[FIRST_WORD + 1] * 6]


def test_min_count_and_max_vocab_cut_the_vocabulary():
    assert fit_tokenizer(TRAIN, 4, min_count=3).vocabulary == ("the", "a", "cat")
    assert fit_tokenizer(TRAIN, 4, max_vocab=2).vocabulary == ("the", "a")
    with pytest.raises(DataError, match="no token"):
        fit_tokenizer(["", " \t", "\u200b"], 4)


def test_the_token_rule_word_runs_single_symbols_and_skipped_separators(tokenizer):
    assert tokenizer.tokens("Don't stop—now!! 1,000 naïve") == ["don", "'", "t", "stop", "—", "now", "!", "!", "1",
                                                               ",", "000", "naïve"]
    assert tokenizer.tokens("😀👨\u200d👩 ❤️ e\u0301") == ["😀", "👨", "👩", "❤", "e\u0301"]   # ZWJ, VS16 skipped
    assert tokenizer.tokens("zero\u200bwidth\ttab\x00nul") == ["zero", "width", "tab", "nul"]
    assert tokenizer.tokens("مرحبا بالعالم") == ["مرحبا", "بالعالم"]
    assert tokenizer.tokens("") == [] and tokenizer.tokens(" \n\t") == []


def test_lower_casing_is_one_code_point_at_a_time_never_str_lower(tokenizer):
    """ONNX Runtime lower-cases each code point alone: no final sigma, and capital I with dot becomes a plain i
    (Python's str.lower gives "ας" and "i" + U+0307)."""
    assert tokenizer.tokens("ΑΣ İSTANBUL STRAẞE ǅ Ⅻ") == ["ασ", "istanbul", "straße", "ǆ", "ⅻ"]
    assert "ΑΣ".lower() == "ας" and "İ".lower() == "i\u0307"
    cased = fit_tokenizer(TRAIN, 6, lowercase=False)
    assert cased.lower == () and cased.tokens("The THE") == ["The", "THE"]
    assert "The" in cased.vocabulary and "the" in cased.vocabulary


def test_no_unicode_normalisation_nfc_and_nfd_are_different_tokens(tokenizer):
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert tokenizer.tokens(nfc) == [nfc] and tokenizer.tokens(nfd) == [nfd]


def test_fitting_is_deterministic_whatever_the_order_of_the_texts():
    shuffled = TRAIN[:]
    random.Random(0).shuffle(shuffled)
    first, second = fit_tokenizer(TRAIN, 8), fit_tokenizer(shuffled, 8)
    assert first.to_json() == second.to_json() and first.sha256 == second.sha256
    assert first.sha256 != fit_tokenizer(TRAIN, 9).sha256 != fit_tokenizer(TRAIN, 8, lowercase=False).sha256


def test_the_json_round_trip_is_exact_and_canonical(tokenizer):
    text = tokenizer.to_json()
    back = Tokenizer.from_json(text)
    assert back == tokenizer and back.sha256 == tokenizer.sha256 and back.to_json() == text
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))   # canonical: what is hashed
    texts = ["The CAT, the dog!", "ΑΣ😀", ""]
    assert np.array_equal(back.encode(texts), tokenizer.encode(texts))
    shape = back.shape("review")
    assert (shape.column, shape.max_tokens, shape.vocab_size, shape.lowercase, shape.tokenizer_sha256) == \
        ("review", 6, tokenizer.vocab_size, True, tokenizer.sha256)


@pytest.mark.parametrize(("edit", "rule"), [
    (lambda d: d.update(format="other/1"), "not a torchship tokenizer"),
    (lambda d: d.update(lowercase="false"), "true or false"),
    (lambda d: d["vocabulary"].append("the"), "there twice"),
    (lambda d: d["vocabulary"].append("two words"), "not one token"),
    (lambda d: d["vocabulary"].append("Capital"), "not one token"),   # unreachable once lower-cased
    (lambda d: d["word"].append([32, 32]), "overlap"),
    (lambda d: d["skip"].append([0x110000, 0x110001]), "outside"),
    (lambda d: d.update(max_tokens=0), "max_tokens"),
    (lambda d: d.pop("vocabulary"), "unreadable"),
])
def test_a_broken_tokenizer_file_is_refused_naming_its_rule(tokenizer, edit, rule):
    data = json.loads(tokenizer.to_json())
    edit(data)
    with pytest.raises(DataError, match=rule):
        Tokenizer.from_json(json.dumps(data))


def test_unknown_shares_count_every_token_of_a_text(tokenizer):
    shares = tokenizer.unknown_shares(["the cat", "the zebra", "zebra " * 20 + "the", ""])
    assert shares.tolist() == [0.0, 0.5, 20 / 21, 0.0]


def test_a_text_that_is_not_a_string_is_refused(tokenizer):
    with pytest.raises(TypeError, match="str"):
        tokenizer.encode(["fine", None])
    assert dataclasses.replace(tokenizer, max_tokens=2).encode(["the cat sat"]).shape == (1, 2)


GRAMS = {"low": 2, "high": 3, "chars": 8, "slots": 4, "min_count": 2, "max_grams": 100}


def test_character_ngrams_follow_the_words_shortest_first_from_the_lowered_prefix():
    fitted = fit_tokenizer(TRAIN, max_tokens=4, grams=GRAMS)
    grams = fitted.grams
    assert grams.first_id == FIRST_WORD + len(fitted.vocabulary)
    assert fitted.vocab_size == grams.first_id + len(grams.vocabulary) and fitted.width == 4 + 4
    assert "th" in grams.vocabulary and "the" in grams.vocabulary and "zz" not in grams.vocabulary
    ids = fitted.encode(["THE Cat sat", "zzz", ""])
    assert ids.shape == (3, 8) and ids[:, :4].tolist() == fitted.encode(["the cat sat", "zzz", ""])[:, :4].tolist()
    gram_id = {gram: grams.first_id + i for i, gram in enumerate(grams.vocabulary)}
    # "the cat " (its first 8 characters): 2-grams left to right, then 3-grams; unknown ones dropped, 4 kept
    prefix = "the cat "
    written = [prefix[i:i + size] for size in (2, 3) for i in range(len(prefix) - size + 1)]
    expected = [gram_id[g] for g in written if g in gram_id]
    assert ids[0, 4:].tolist() == expected[:4] and len(expected) > 4
    assert ids[1, 4:].tolist() == [PAD] * 4 and ids[2].tolist() == [PAD] * 8
    # only the first `chars` characters are read: grams of the 9th character on never appear
    assert fitted.encode(["zzzzzzz" + "the"])[0, 4:].tolist() == [PAD] * 4


def test_character_ngrams_round_trip_and_words_only_files_keep_their_hash(tokenizer):
    with_grams = fit_tokenizer(TRAIN, max_tokens=4, grams=GRAMS)
    back = Tokenizer.from_json(with_grams.to_json())
    assert back == with_grams and back.sha256 == with_grams.sha256 and back.shape("t").gram_slots == 4
    assert "char_grams" not in json.loads(tokenizer.to_json())   # a tokenizer written before grams reads the same
    data = json.loads(with_grams.to_json())
    data["char_grams"]["vocabulary"].append("four")
    with pytest.raises(DataError, match="not 2..3 characters"):
        Tokenizer.from_json(json.dumps(data))
    data = json.loads(with_grams.to_json())
    data["char_grams"]["chars"] = 5000
    with pytest.raises(DataError, match="at most 1000"):
        Tokenizer.from_json(json.dumps(data))


def test_a_gram_vocabulary_over_the_limit_is_refused(monkeypatch):
    """A hand-edited file cannot make the graph hold any number of gram keys."""
    import tasks.modalities.text.grams as grams_module

    text = fit_tokenizer(TRAIN, max_tokens=4, grams=GRAMS).to_json()
    monkeypatch.setattr(grams_module, "MAX_GRAMS", 3)
    with pytest.raises(DataError, match="vocabulary of 1..3"):
        Tokenizer.from_json(text)
