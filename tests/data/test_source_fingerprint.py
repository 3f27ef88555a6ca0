"""data/source.json: what identifies the source's content, for a file, a folder of Parquet parts or a
built-in source; rewritten only when it changes (so DVC re-runs prepare only then)."""
from __future__ import annotations

import pandas as pd

from tasks.config import parse_params
from tasks.modalities.sources import fingerprint_source, write_source_fingerprint


def test_a_folder_source_changes_its_fingerprint_when_a_part_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "rows.parquet"
    folder.mkdir()
    pd.DataFrame({"a": [1.0, 2.0], "y": ["x", "z"]}).to_parquet(folder / "part-0.parquet")
    data = parse_params({"data": {"source": str(folder), "target": "y"}})
    before = fingerprint_source(data)
    assert before["md5"] == fingerprint_source(data)["md5"]
    pd.DataFrame({"a": [3.0], "y": ["x"]}).to_parquet(folder / "part-1.parquet")
    assert fingerprint_source(data)["md5"] != before["md5"]


def test_the_fingerprint_is_rewritten_only_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "rows.csv"
    path.write_text("a,y\n1,x\n2,z\n")
    data, target = parse_params({"data": {"source": str(path), "target": "y"}}), tmp_path / "source.json"
    assert write_source_fingerprint(data, target) is True
    assert write_source_fingerprint(data, target) is False
    path.write_text("a,y\n1,x\n2,x\n")
    assert write_source_fingerprint(data, target) is True
