"""`torchship predict` on the tiny pipeline's registered champion: a CSV and a Parquet file scored chunk by chunk
agree with the service's own scoring of the same rows; bad rows refuse the whole file, naming every line; the CLI
end to end (in-process)."""
from __future__ import annotations

import csv
import os

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from flows.cli import app
from serving.batch_scoring import load_version
from tasks.config import load_params
from tasks.core.errors import DataError
from tasks.core.scored_files import FileRefused
from tasks.modalities.table.batch import predict_file

pytestmark = pytest.mark.integration
TARGET = "churned"


@pytest.fixture(scope="module")
def champion(tiny_pipeline):
    """(project, the champion loaded as the service loads it, 300 holdout rows with their label)."""
    project, _ = tiny_pipeline
    here = os.getcwd()
    os.chdir(project.root)   # params' tracking URI is relative to the project
    try:
        variant = load_version(load_params())
    finally:
        os.chdir(here)
    holdout = pd.read_parquet(project.root / "data/prepare/holdout.parquet").head(300)
    return project, variant, holdout


def service_probabilities(variant, frame: pd.DataFrame) -> np.ndarray:
    """The service's answer to one request holding all the rows (its decoder, its graph)."""
    rows = [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in
            frame[variant.schema.feature_names].to_dict("records")]
    import orjson

    return variant.score(variant.decoder.decode(orjson.dumps({"rows": rows})))


@pytest.mark.parametrize("source_suffix,output_suffix", [(".csv", ".parquet"), (".parquet", ".csv")])
def test_a_file_is_scored_in_chunks_as_the_service_scores_its_rows(champion, tmp_path, source_suffix, output_suffix):
    _, variant, holdout = champion
    source = tmp_path / f"rows{source_suffix}"
    holdout.to_csv(source, index=False) if source_suffix == ".csv" else holdout.to_parquet(source, index=False)
    output = tmp_path / f"scored{output_suffix}"

    summary = predict_file(source, output, variant, chunk_rows=64, show_progress=False)

    scored = pd.read_parquet(output) if output_suffix == ".parquet" else pd.read_csv(output)
    assert summary.rows == len(scored) == len(holdout) and summary.chunks == 5
    classes = variant.schema.classes
    # Request by request as the chunks were: a dynamically quantised (int8) graph scales activations by the
    # batch, so the same row can score ~1e-3 apart in another batch.
    expected = np.concatenate([service_probabilities(variant, holdout[i:i + 64]) for i in range(0, len(holdout), 64)])
    np.testing.assert_allclose(scored[[f"probability_{c}" for c in classes]].to_numpy(), expected, atol=1e-6)
    assert scored["prediction"].astype(str).tolist() == [classes[i] for i in variant.labels(expected)]   # its rule
    unit, first = ("line", 2) if source_suffix == ".csv" else ("row", 1)
    assert scored[unit].tolist() == list(range(first, first + len(holdout)))
    assert scored[TARGET].astype(str).tolist() == holdout[TARGET].astype(str).tolist()   # carried through
    assert sum(summary.labels.values()) == len(holdout)


def test_rows_the_service_would_refuse_refuse_the_file_naming_every_line(champion, tmp_path):
    _, variant, holdout = champion
    numeric = variant.decoder.number_names[0]
    source = tmp_path / "rows.csv"
    holdout.to_csv(source, index=False)
    lines = source.read_text().splitlines()
    header = lines[0].split(",")
    column = header.index(numeric)
    bad = {5: "lots", 150: "inf", 290: "1e999"}   # file lines (header = 1): text, infinity, overflow to infinity
    for line, value in bad.items():
        cells = next(csv.reader([lines[line - 1]]))
        cells[column] = value
        lines[line - 1] = ",".join(f'"{c}"' if "," in c else c for c in cells)
    source.write_text("\n".join(lines) + "\n")
    output = tmp_path / "scored.csv"
    output.write_text("the previous predictions\n")

    with pytest.raises(FileRefused) as refused:
        predict_file(source, output, variant, chunk_rows=64, show_progress=False)

    assert "3 problem(s)" in str(refused.value) and f"line 5, column '{numeric}'" in str(refused.value)
    problems = pd.read_csv(tmp_path / "scored.csv.problems.csv")
    assert problems["line"].tolist() == list(bad) and set(problems["column"]) == {numeric}
    assert set(problems["rule"]) >= {"finite_number"}
    assert output.read_text() == "the previous predictions\n"   # a refused file replaces nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".scored")]   # no temp file left


def test_a_file_without_a_feature_column_is_refused_before_scoring(champion, tmp_path):
    _, variant, holdout = champion
    missing = variant.schema.feature_names[-1]
    source = tmp_path / "rows.parquet"
    holdout.drop(columns=[missing]).to_parquet(source)
    with pytest.raises(DataError, match=f"needs column\\(s\\) \\['{missing}'\\]"):
        predict_file(source, tmp_path / "out.csv", variant, show_progress=False)
    with pytest.raises(DataError, match=r"\.csv or \.parquet"):
        predict_file(source, tmp_path / "out.json", variant, show_progress=False)


def test_the_command_scores_a_file_with_the_champion_or_a_version(champion, tmp_path, monkeypatch):
    project, variant, holdout = champion
    source = tmp_path / "rows.csv"
    holdout.head(50).to_csv(source, index=False)
    saved = dict(os.environ)
    monkeypatch.chdir(project.root)
    try:
        runner = CliRunner()
        by_alias = runner.invoke(app, ["predict", str(source), "--output", str(tmp_path / "a.csv")])
        by_version = runner.invoke(app, ["predict", str(source), "-o", str(tmp_path / "b.csv"),
                                         "--version", variant.version])
        absent = runner.invoke(app, ["predict", str(source), "-o", str(tmp_path / "c.csv"), "--alias", "nobody"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert by_alias.exit_code == 0, by_alias.output
    assert f"scored 50 rows of {source} with v{variant.version}" in " ".join(by_alias.output.split())
    assert by_version.exit_code == 0, by_version.output
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert absent.exit_code == 2 and "no version with alias 'nobody'" in " ".join(absent.output.split())
