"""The image commands through the CLI in this process (typer's CliRunner, from a project folder of its own):
`torchship contract suggest DIR` prints an image contract that loads back as params, and `torchship predict DIR -o
OUT.csv` scores a folder of PNGs. predict's registry load (serving/batch_scoring.py load_version: MLflow, a
registered champion) is replaced by the same kind of variant read from a served model file; everything after it,
the command's options, serving/batch.py's routing by modality and tasks/modalities/image/batch.py, runs as shipped."""
from __future__ import annotations

import base64
import os

import numpy as np
import orjson
import pandas as pd
import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from flows.cli import app
from tasks.config import parse_params
from tasks.core.runtime import open_onnx
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageContract, ImageShape
from tests.helpers.images import CLASSES, served_image_model, shapes_folder

SCHEMA = Schema(source="t", target="label", classes=CLASSES, modality="image",
                inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    """invoke(*args): the CLI run from a bare project folder (params.yaml, dvc.yaml); the working directory and the
    environment the commands set are put back afterwards."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "params.yaml").write_text("{}\n")
    (project / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(project)
    saved = dict(os.environ)
    yield lambda *args: CliRunner().invoke(app, list(args))
    os.environ.clear()
    os.environ.update(saved)


def test_contract_suggest_prints_an_image_contract_that_loads_as_params(cli, tmp_path):
    folder = shapes_folder(tmp_path / "shapes", count=40)
    result = cli("contract", "suggest", str(folder))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith("# Proposed from") and "40 images" in text
    contract = parse_params(YAML(typ="safe").load(text), origin="suggested").contract
    assert isinstance(contract, ImageContract)
    assert contract.modality == "image" and contract.classes == sorted(CLASSES) and contract.mode == "RGB"
    assert contract.width.min <= 32 <= contract.width.max and contract.height.min <= 32 <= contract.height.max
    assert 0 <= contract.brightness.min < contract.brightness.max <= 255


def test_contract_suggest_names_what_it_left_out(cli, tmp_path):
    folder = shapes_folder(tmp_path / "shapes", count=20)
    (folder / "circle" / "notes.png").write_text("not an image\n")
    result = cli("contract", "suggest", str(folder))
    assert result.exit_code == 0, result.output
    assert "# Left out of the profile: 1 image(s): circle/notes.png" in result.stdout


@pytest.fixture()
def served_file(tmp_path, monkeypatch):
    """The served model file predict scores with, in place of the registered champion."""
    import serving.batch
    from serving.variants import file_variant

    model_file = served_image_model(tmp_path, SCHEMA)
    monkeypatch.setattr(serving.batch, "load_version", lambda params, version, alias: file_variant("champion",
                                                                                                   model_file, 1))
    return model_file


def graph_probabilities(model_file, files: list[bytes]) -> np.ndarray:
    """The served graph's probabilities of the files sent to it as one base64 request."""
    from tasks.modalities.image.decode import ImageLimits
    from tasks.modalities.image.serving import ImageDecoder

    decoder = ImageDecoder(SCHEMA, ImageLimits())
    pixels = decoder.feed(decoder.decode(orjson.dumps({"images": [base64.b64encode(f).decode() for f in files]})))
    return open_onnx(model_file, 1).run(["probabilities"], pixels)[0]


def test_predict_scores_a_folder_of_images_into_a_csv(cli, tmp_path, served_file):
    folder = shapes_folder(tmp_path / "shapes", count=12)   # 32x32: brought to the model's 16x16
    output = tmp_path / "out" / "scored.csv"
    output.parent.mkdir()
    result = cli("predict", str(folder), "-o", str(output), "--chunk-rows", "5")
    assert result.exit_code == 0, result.output
    assert "scored 12 rows" in result.stdout and "(3 chunks)" in result.stdout
    scored = pd.read_csv(output)
    files = sorted(folder.rglob("*.png"))
    names = [f"{f.parent.name}/{f.name}" for f in files]
    assert sorted(scored["image"]) == sorted(names)
    assert (scored["label"] == scored["image"].str.split("/").str[0]).all()   # the class folder it came from
    scored = scored.set_index("image").loc[names]
    expected = graph_probabilities(served_file, [f.read_bytes() for f in files])
    np.testing.assert_allclose(scored[[f"probability_{c}" for c in CLASSES]].to_numpy(), expected, rtol=1e-5,
                               atol=1e-6)
    assert list(scored["prediction"]) == [CLASSES[i] for i in expected.argmax(1)]


def test_predict_refuses_a_folder_with_a_broken_image_and_writes_nothing(cli, tmp_path, served_file):
    folder = shapes_folder(tmp_path / "shapes", count=8)
    (folder / "cross" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    output = tmp_path / "scored.csv"
    result = cli("predict", str(folder), "-o", str(output))
    assert result.exit_code != 0 and "cross/broken.png" in result.output
    assert not output.exists() and "cross/broken.png" in (tmp_path / "scored.csv.problems.csv").read_text()
