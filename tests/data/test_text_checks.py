"""The text contract on the per-text metadata table (tasks/modalities/text/checks.py, expectations.py, contract.py,
near_duplicates.py): one pass names every bad text with every rule it breaks, in pandas and in Great Expectations
alike; a suggested contract accepts its own reference; near copies across splits are found fast."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.core import paths
from tasks.modalities.text.checks import class_warnings, judge_texts, metadata_table, quarantine_texts, rules_for
from tasks.modalities.text.contract import TextContract, suggest_text_contract
from tasks.modalities.text.expectations import judge_texts_gx
from tasks.modalities.text.generated import generate_tickets
from tasks.modalities.text.near_duplicates import cross_split_near_duplicates, near_duplicate_groups
from tasks.modalities.text.settings import TextParams
from tasks.modalities.text.sources import folder_texts, inspect_text

CONTRACT = TextContract(modality="text", classes=["neg", "pos"], max_chars=400, max_bad_share=0.5)
LEAKED = ("the courier left my parcel at the wrong house again and nobody answered the phone for two days "
          "when I called")


def bad_folder(root):
    """Good texts in pos/ and neg/, and one file of every bad kind; {name: the rule it must be refused by}."""
    good = generate_tickets(40, seed=0)["text"]
    for i, text in enumerate(good):
        folder = root / ("pos" if i % 2 else "neg")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:02d}.txt").write_text(text, encoding="utf-8")
    (root / "pos" / "leak-train.txt").write_text(LEAKED, encoding="utf-8")
    (root / "pos" / "leak-holdout.txt").write_text(LEAKED.replace("two days", "three days") + "!",
                                                   encoding="utf-8")
    bad = {"neg/latin1.txt": ("caf\xe9 was cold".encode("latin-1"), "decodable"),
           "neg/binary.txt": (b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(40), "decodable"),
           "neg/huge.txt": (b"word " * 250_000, "decodable"),
           "neg/empty.txt": (b"", "not empty or whitespace-only"),
           "neg/blank.txt": (b" \n\t  ", "not empty or whitespace-only"),
           "neg/long.txt": (b"x" * 401, "length within [1, 400] characters"),
           "spam/0.txt": (b"buy cheap watches now", "label in the class set"),
           "loose.txt": (b"a text in no class folder", "label present"),
           "pos/zero-width.txt": ("in\u200bvisible\u200b text\u202e with\u2066 ten\u200d of\u200c them\u200b\u2060"
                                  "\ufeff\u00ad".encode(), "zero-width and bidi characters at most 8"),
           "pos/symbols.txt": (b"$$$ !!! 123 456 ### %%% ^^^ k", "non-letter share at most 0.9"),
           "pos/copy.txt": ((root / "neg" / "00.txt").read_bytes(), "not an exact copy of another text"),
           "pos/leak-holdout.txt": (None, "no near duplicate in an earlier split")}
    for name, (data, _) in bad.items():
        if data is not None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
    return {name: rule for name, (_, rule) in bad.items()}


def split_of(records) -> list[str]:
    return ["holdout" if r.name == "pos/leak-holdout.txt" else "train" for r in records]


def test_one_pass_names_every_bad_text_with_its_rule_in_pandas_and_in_gx(tmp_path):
    bad = bad_folder(tmp_path / "set")
    records = folder_texts(tmp_path / "set", max_chars=CONTRACT.max_chars)
    table = metadata_table(records, split_of(records), CONTRACT.near_duplicate_jaccard)
    rules = rules_for(table["label"], TextParams(), CONTRACT)
    verdicts = judge_texts(table, rules)
    assert set(verdicts.refused) == set(bad)
    for name, rule in bad.items():
        assert any(broken.startswith(rule) for broken in verdicts.refused[name]), (name, verdicts.refused[name])
    said = {name: " | ".join(rules) for name, rules in verdicts.refused.items()}
    assert "not UTF-8: byte 0xE9 at offset 3" in said["neg/latin1.txt"] and "NUL" in said["neg/binary.txt"]
    assert "1,250,000 bytes is over the limit of 1,600" in said["neg/huge.txt"]
    assert "got 401" in said["neg/long.txt"] and "got 'spam'" in said["spam/0.txt"]
    assert "a copy of neg/00.txt" in said["pos/copy.txt"]
    assert "near pos/leak-train.txt (train), Jaccard 0.8" in said["pos/leak-holdout.txt"]
    assert "got 10" in said["pos/zero-width.txt"]
    gx_verdicts, report = judge_texts_gx(table, rules)
    assert gx_verdicts.refused == verdicts.refused and gx_verdicts.counts == verdicts.counts
    assert {row["rule"] for row in report if not row["success"]} == {w for w, n in verdicts.counts.items() if n}


def test_control_characters_and_token_limits_are_named_with_value_and_limit():
    records = [inspect_text("a", "fine text here", 100, "pos"), inspect_text("b", "bell\x07 rings twice", 100, "pos"),
               inspect_text("c", "one two three four five six", 100, "neg")]
    contract = CONTRACT.model_copy(update={"max_tokens": 5})
    verdicts = judge_texts(metadata_table(records), rules_for([], TextParams(), contract))
    assert verdicts.refused == {"b": ["control characters at most 0: got 1"],
                                "c": ["tokens within [1, 5] (whitespace-separated): got 6"]}


def test_without_a_contract_the_rules_take_the_params_and_the_sets_own_classes():
    rules = rules_for(["b", "a", None, "b"], TextParams(max_chars=50, allow_duplicates=True), None)
    assert rules.classes == ["a", "b"] and rules.chars == (1, 50) and rules.allow_duplicates


def test_a_suggested_contract_accepts_every_text_of_its_reference():
    frame = generate_tickets(1500, seed=5)
    # the reference's extremes must pass too: the range is the observed min and max widened, never a quantile
    texts = [*frame["text"], "ok", "x" * 5000, "tab\tand\x07bell", "emoji 👨‍👩‍👧 family", "!!! ??? ..."]
    labels = [*frame["label"], "billing", "shipping", "account", "technical", "billing"]
    contract = suggest_text_contract(texts, labels, margin=0.1)
    assert contract.classes == sorted(set(frame["label"])) and contract.min_chars == 1
    assert contract.max_chars >= 5000 and contract.max_control_chars >= 1 and contract.max_non_letter_share == 1.0
    records = [inspect_text(f"t{i}", text, contract.max_chars, label) for i, (text, label) in
               enumerate(zip(texts, labels))]
    verdicts = judge_texts(metadata_table(records), rules_for(labels, TextParams(), contract))
    assert verdicts.refused == {}
    tight = contract.model_copy(update={"max_chars": 4000})
    assert set(judge_texts(metadata_table(records), rules_for(labels, TextParams(), tight)).refused) == {"t1501"}


def test_a_contract_that_no_text_could_pass_is_refused():
    with pytest.raises(ValueError, match="min_chars 10 is above max_chars 5"):
        TextContract(modality="text", classes=["a", "b"], min_chars=10, max_chars=5)
    with pytest.raises(ValueError, match="extra"):
        TextContract(modality="text", classes=["a", "b"], max_lenght=5)


def test_a_class_far_above_the_others_is_named_in_a_warning():
    labels = ["spam"] * 900 + ["ham"] * 50 + ["eggs"] * 50
    [warning] = class_warnings(labels, max_ratio=10.0)
    assert "class 'spam' holds 90.0%" in warning and "18.0x" in warning
    assert class_warnings(["a"] * 60 + ["b"] * 40, max_ratio=10.0) == []


def test_near_copies_across_splits_flag_the_later_copy_only():
    texts = [LEAKED, LEAKED.upper(), LEAKED.replace("parcel", "package"), "an unrelated note about billing twice",
             "an unrelated note about billing twice", None]
    splits = ["holdout", "train", "val", "train", "holdout", "val"]
    partner, similarity = cross_split_near_duplicates(texts, splits, 0.8)
    assert partner.tolist() == [1, -1, 1, -1, 3, -1]
    assert similarity[0] == 1.0 and 0.8 <= similarity[2] < 1.0 and np.isnan(similarity[1])
    groups = near_duplicate_groups([t or "" for t in texts], 0.8)
    assert groups[0] == groups[1] == groups[2] != groups[3] == groups[4]


def test_refused_texts_are_quarantined_with_their_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src" / "pos").mkdir(parents=True)
    (tmp_path / "src" / "pos" / "bad.txt").write_bytes(b"\xff\xfe bad")
    records = [*folder_texts(tmp_path / "src", 100), inspect_text("t.csv row 4", "", 100, "pos")]
    refused = {"pos/bad.txt": ["decodable: not UTF-8"], "t.csv row 4": ["not empty or whitespace-only"]}
    folder = quarantine_texts(records, refused, "src", max_share=0.05)
    assert folder.parent == paths.QUARANTINE
    assert (folder / "files" / "pos" / "bad.txt").read_bytes() == b"\xff\xfe bad"
    [line] = (folder / "texts.jsonl").read_text().splitlines()
    assert json.loads(line) == {"name": "t.csv row 4", "label": "pos", "text": "", "rules": refused["t.csv row 4"]}
    report = json.loads((folder / "report.json").read_text())
    assert report["status"] == "fail" and report["texts_refused"] == refused


def test_near_duplicates_are_found_among_thousands_of_texts():
    """Seconds, not minutes (40,000 tweets take about 1.5 s): 12,000 tickets plus 200 planted near copies, each
    found in the later split."""
    count = 12_000
    texts = list(generate_tickets(count, seed=9)["text"])
    planted = [texts[i] + " thanks" for i in range(0, 2000, 10)]
    splits = ["train"] * count + ["holdout"] * len(planted)
    partner, _ = cross_split_near_duplicates(texts + planted, splits, 0.8)
    found = partner[count:]
    assert (found >= 0).all() and (found == np.arange(0, 2000, 10)).mean() > 0.95
