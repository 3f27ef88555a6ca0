"""prepare, validate and the batch door on texts, in process: a folder with the bad inputs users bring (not UTF-8, an
empty file, a one-megabyte text, a label outside the contract's classes, a binary file named .txt, an exact copy)
has each named with its rule in one pass and quarantined, while the rest is prepared; near copies land in one split;
the tokenizer sees the training split only; a text keeps its split when texts join the set; validate refuses a near
copy planted across splits, the batch door one of a prepared text; and a table with a free-text column is text,
refused as a table with the way to read it."""
from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from tasks.config import parse_params
from tasks.core import paths
from tasks.core.errors import DataError
from tasks.core.schema_spec import load_schema
from tasks.modalities import detect_modality
from tasks.modalities.text.generated import generate_tickets
from tasks.modalities.text.shards import read_metadata, read_texts, write_split

CLASSES = ["billing", "shipping"]
BAD = {  # file -> (its bytes, the words of the rule it breaks)
    "billing/latin1.txt": ("caf\xe9 cr\xe8me br\xfbl\xe9e for my refund".encode("latin-1"), "not UTF-8"),
    "billing/empty.txt": (b"   \n", "not empty or whitespace-only"),
    "shipping/huge.txt": (b"parcel " * 150_000, "over the limit"),
    "refunds/other.txt": (b"I want my money back for the broken box", "label in the class set"),
    "shipping/binary.txt": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary, not text"),
}


def ticket_folder(root, count: int = 90, seed: int = 3) -> list[tuple[str, str]]:
    """`root/<class>/<i>.txt` for generated billing and shipping tickets; returns (name, text) of each."""
    tickets = generate_tickets(count * 2, seed=seed)
    tickets = tickets[tickets["label"].isin(CLASSES)].head(count)
    written = []
    for i, (text, label) in enumerate(zip(tickets["text"], tickets["label"])):
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / f"{i}.txt").write_text(text, encoding="utf-8")
        written.append((f"{label}/{i}.txt", text))
    return written


def text_params(source, **contract):
    return parse_params({"data": {"source": str(source), "modality": "text"}, "validate": {"min_rows": 10},
                         "contract": {"modality": "text", "classes": CLASSES, **contract}})


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """A folder of tickets with the bad files and near copies, prepared in `tmp_path` (data/ there)."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "tickets"
    texts = ticket_folder(folder)
    for name, (data, _) in BAD.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    (folder / "billing" / "copy.txt").write_text(texts[0][1], encoding="utf-8")
    for i in range(4):   # near copies: one word added at the end
        (folder / "shipping" / f"near-{i}.txt").write_text(texts[10 + i][1] + " thanks", encoding="utf-8")
    params = text_params(folder, max_bad_share=0.2, max_chars=50_000)
    metrics = detect_modality(params.data, params).prepare(params, "label")
    return params, metrics, texts


def test_bad_texts_are_named_with_their_rule_in_one_pass_and_quarantined(prepared, tmp_path):
    _, metrics, _ = prepared
    assert metrics["refused"] == len(BAD) + 1 and metrics["texts"] == 90 + len(BAD) + 5
    [folder] = (tmp_path / "data" / "quarantine").iterdir()
    report = json.loads((folder / "report.json").read_text())
    refused = report["texts_refused"]
    for name, (data, rule) in BAD.items():
        assert any(rule in words for words in refused[name]), (name, refused[name])
        assert (folder / "files" / name).read_bytes() == data   # the file itself is kept
    assert any("exact copy" in words for words in refused["billing/copy.txt"])
    assert any("max_chars 50,000" in words for words in refused["shipping/huge.txt"])   # the contract's limit
    kept = pd.concat([read_metadata(path) for path in (paths.TRAIN_SPLIT, paths.VAL_SPLIT, paths.HOLDOUT_SPLIT)])
    assert not set(refused) & set(kept["name"]) and len(kept) == 90 + 4


def test_near_copies_share_a_split_and_the_tokenizer_sees_the_training_split_only(prepared):
    _, _, texts = prepared
    from tasks.modalities.text.inputs import schema_tokenizer

    splits = {split: read_metadata(path).assign(text=read_texts(path)) for split, path in
              (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT))}
    where = {name: split for split, frame in splits.items() for name in frame["name"]}
    for i in range(4):
        assert where[f"shipping/near-{i}.txt"] == where[texts[10 + i][0]]
    tokenizer = schema_tokenizer(load_schema(paths.SCHEMA))
    train_tokens = {t for text in splits["train"]["text"] for t in tokenizer.tokens(text)}
    unseen = {t for split in ("val", "holdout") for text in splits[split]["text"] for t in tokenizer.tokens(text)}
    unseen -= train_tokens
    assert unseen and not unseen & set(tokenizer.vocabulary)


def test_validate_passes_the_splits_and_refuses_a_near_copy_planted_across_them(prepared):
    params, _, _ = prepared
    schema = load_schema(paths.SCHEMA)
    modality = detect_modality(params.data, params)
    gate, rows = modality.validate(params, schema)
    assert gate.status == "pass", gate.reasons
    assert all(row["success"] for row in rows) and (paths.DATA_DOCS / "index.html").exists()
    train, holdout = (read_metadata(p).assign(text=read_texts(p)) for p in (paths.TRAIN_SPLIT, paths.HOLDOUT_SPLIT))
    leak = train.iloc[:1].assign(name="planted.txt", text=train["text"].iloc[0] + " asap")
    write_split(paths.HOLDOUT_SPLIT, pd.concat([holdout, leak], ignore_index=True))
    gate, _ = modality.validate(params, schema)
    assert gate.status == "fail" and "planted.txt" in gate.reasons[0] and "near duplicate" in gate.reasons[0]


def test_the_batch_door_refuses_a_copy_of_a_prepared_text_and_a_foreign_class(prepared, tmp_path):
    params, _, texts = prepared
    schema = load_schema(paths.SCHEMA)
    batch = tmp_path / "batch"
    fresh = ticket_folder(batch, count=30, seed=77)
    holdout = read_texts(paths.HOLDOUT_SPLIT)
    (batch / "billing" / "leak.txt").write_text(holdout[0] + " please", encoding="utf-8")
    (batch / "refunds").mkdir()
    (batch / "refunds" / "x.txt").write_text("where is my refund for the damaged parcel", encoding="utf-8")
    labelled = detect_modality(params.data, params).judge_batch(batch, params, schema)
    said = " ".join(labelled.gate.reasons)
    assert labelled.offered == len(fresh) + 2 and labelled.quarantined == 2, said
    assert "billing/leak.txt" in said and "leakage across splits" in said and "refunds/x.txt" in said
    assert labelled.store is not None   # 2 of 32 is within the contract's share: the rest may join
    stored = pd.read_parquet(labelled.store())
    assert len(stored) == len(fresh) and "leak.txt" not in " ".join(stored["name"])
    modality = detect_modality(params.data, params)   # what a retrain learns from, and prepare reads next
    assert len(modality.labelled_times()) == len(fresh)
    assert modality.labelled_batch(params, schema, None, 0.0, time.time() + 60).accepted == len(fresh)
    assert modality.labelled_batch(params, schema, None, time.time() + 60, time.time() + 120).gate.status == "fail"
    metrics = modality.prepare(params, "label")
    assert metrics["texts"] == 90 + len(BAD) + 5 + len(fresh)


def test_a_suggested_text_contract_accepts_its_own_reference(tmp_path):
    from tasks.modalities.text.contract import TextContract

    ticket_folder(tmp_path / "reference", count=40)
    params = parse_params({"data": {"source": str(tmp_path / "reference")}})
    suggestion = detect_modality(params.data, params).suggest_contract(params, "label", 0.1)
    assert isinstance(suggestion.contract, TextContract) and suggestion.contract.classes == CLASSES
    assert suggestion.items == 40 and suggestion.unit == "texts" and suggestion.contract.text_column is None


def test_a_table_with_a_free_text_column_is_text_and_refused_as_a_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tickets = generate_tickets(120, seed=9)
    tickets.assign(stars=[str(i % 5) for i in range(120)]).rename(columns={"text": "review"}).to_csv(
        tmp_path / "reviews.csv", index=False)
    auto = parse_params({"data": {"source": str(tmp_path / "reviews.csv"), "target": "label"}})
    assert detect_modality(auto.data, auto).name == "text"
    table = parse_params({"data": {"source": str(tmp_path / "reviews.csv"), "target": "label", "modality": "table"}})
    with pytest.raises(DataError) as refused:
        detect_modality(table.data, table).prepare(table, "label")
    said = str(refused.value)
    assert "column 'review' holds free text" in said and "--set data.modality=text" in said
    assert not paths.TRAIN_SPLIT.exists()


def test_a_text_keeps_its_split_when_texts_join_the_set():
    """A retrain's ingested texts join the set: a text prepared before moves at most across the edges of the
    validation band, never from training into the holdout, so the holdout a retrain and its champion are compared on
    holds no text the champion was trained on; and a class of three texts still has one in each split."""
    from tasks.core.params_spec import PrepareParams
    from tasks.modalities.text.prepare import split_groups

    def splits(frame: pd.DataFrame) -> dict[str, str]:
        named = split_groups(frame["label"], frame["text"], pd.factorize(frame["text"])[0], PrepareParams(), "t")
        return dict(zip(frame["text"], named))

    before = generate_tickets(400, seed=7)
    after = splits(pd.concat([before, generate_tickets(200, seed=8, drift=1.0)], ignore_index=True))
    before = splits(before)
    moved = [(split, after[text]) for text, split in before.items() if after[text] != split]
    assert all("val" in move for move in moved), moved   # only across the validation band's edges
    assert len(moved) <= 0.06 * len(before)
    shares = pd.Series(list(after.values())).value_counts(normalize=True)
    assert abs(shares["holdout"] - 0.15) < 0.01 and abs(shares["val"] - 0.15) < 0.01   # stratified, per class
    rare = pd.DataFrame({"text": ["a b c", "d e f", "g h i"], "label": "rare"})
    named = splits(pd.concat([generate_tickets(40, seed=9), rare], ignore_index=True))
    assert sorted(named[text] for text in rare["text"]) == ["holdout", "train", "val"]
