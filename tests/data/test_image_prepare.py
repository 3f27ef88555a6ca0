"""The image modality's prepare core (tasks/modalities/image/prepare.py): one pass over every file names each bad one with the
rule it breaks (Great Expectations on the metadata table), quarantines it with the report, and splits the rest."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.core import paths
from tasks.core.errors import DataError
from tasks.core.params_spec import PrepareParams
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image.contract import ImageContract, suggest_image_contract, image_shape
from tasks.modalities.image.decode import ImageLimits, inspect_image
from tasks.modalities.image.prepare import prepare_images
from tasks.modalities.image.shards import read_metadata, read_pixels, write_split
from tasks.modalities.image.sources import folder_images, list_images
from tests.helpers.images import CLASSES, add_bad_files, shapes_folder


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # quarantine folders land under this test's data/
    return tmp_path


@pytest.fixture()
def bad_set(in_tmp):
    root = shapes_folder(in_tmp / "shapes", count=120)
    return root, add_bad_files(root)


CONTRACT = ImageContract(modality="image", classes=CLASSES, mode="RGB", max_bad_share=0.1)


def test_one_pass_names_every_bad_file_with_its_rule_and_quarantines_it(bad_set):
    root, bad = bad_set
    prepared = prepare_images(folder_images(root), str(root), "label", ImagesParams(), PrepareParams(), CONTRACT)
    assert set(prepared.refused) == set(bad)
    for name, rule in bad.items():
        assert any(rule in broken for broken in prepared.refused[name]), (name, prepared.refused[name])
    assert "pixels" in prepared.refused["circle/bomb.png"][0] and "not decoded" in prepared.refused["circle/bomb.png"][0]
    assert "circle/0.png" in " ".join(prepared.refused["triangle/copy.png"])   # names the image it repeats
    [folder] = list(paths.QUARANTINE.iterdir())
    report = json.loads((folder / "report.json").read_text())
    assert set(report["files"]) == set(bad) and report["status"] == "warn"
    for name in bad:   # every refused file is kept, byte for byte
        assert (folder / "files" / name).read_bytes() == (root / name).read_bytes()
    kept = sum(len(split) for split in prepared.splits.values())
    assert kept == 120 and prepared.images == 120 + len(bad)


def test_a_refused_share_over_the_contract_fails_and_still_quarantines(bad_set):
    root, bad = bad_set
    strict = CONTRACT.model_copy(update={"max_bad_share": 0.01})
    with pytest.raises(DataError) as refusal:
        prepare_images(folder_images(root), str(root), "label", ImagesParams(), PrepareParams(), strict)
    message = str(refusal.value)
    assert "over the 1%" in message and all(name in message for name in bad)
    assert len(list(paths.QUARANTINE.iterdir())) == 1


def test_splits_are_stratified_disjoint_and_at_the_model_size(in_tmp):
    files, origin = list_images("images:shapes", "label", "path", 400, seed=3)
    prepared = prepare_images(files, origin, "label", ImagesParams(), PrepareParams())
    assert not prepared.refused
    names = [set(split["name"]) for split in prepared.splits.values()]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    for split, frame in prepared.splits.items():
        assert prepared.pixels[split].shape == (len(frame), 32, 32, 3)
        shares = frame["label"].value_counts(normalize=True)
        assert shares.max() - shares.min() < 0.06, split
    assert prepared.schema.classes == sorted(CLASSES) and image_shape(prepared.schema).shape == (32, 32, 3)


def test_images_of_other_sizes_are_brought_to_the_model_size(in_tmp):
    root = shapes_folder(in_tmp / "shapes", count=60)
    shapes_folder(in_tmp / "big", count=12, side=48)
    for path in (in_tmp / "big").rglob("*.png"):
        path.rename(root / path.parent.name / f"big-{path.name}")
    prepared = prepare_images(folder_images(root), str(root), "label", ImagesParams(), PrepareParams())
    assert not prepared.refused and image_shape(prepared.schema).shape == (32, 32, 3)   # the most common size wins
    assert {p.shape[1:] for p in prepared.pixels.values()} == {(32, 32, 3)}


def test_a_split_round_trips_through_its_shard_file(in_tmp):
    files, origin = list_images("images:digits", "label", "path", 0, seed=0)
    prepared = prepare_images(files[:300], origin, "label", ImagesParams(), PrepareParams())
    path = in_tmp / "train.parquet"
    frame, pixels = prepared.splits["train"], prepared.pixels["train"]
    written = write_split(path, [(pixels[:100], frame.iloc[:100]), (pixels[100:], frame.iloc[100:])], "label",
                          image_shape(prepared.schema).shape)
    assert written == len(frame)
    np.testing.assert_array_equal(read_pixels(path, image_shape(prepared.schema).shape), pixels)
    assert read_metadata(path, "label")["name"].tolist() == frame["name"].tolist()


def test_digits_ship_in_the_wheel_as_8x8_grayscale(in_tmp):
    files, _ = list_images("images:digits", "label", "path", 0, seed=0)
    record = inspect_image(files[0].name, files[0].read(), ImageLimits(), files[0].label)
    assert len(files) == 1797 and record.decodable and record.mode == "L" and (record.width, record.height) == (8, 8)


def test_contract_suggest_proposes_what_the_reference_images_hold(in_tmp):
    root = shapes_folder(in_tmp / "shapes", count=40)
    rows = [inspect_image(f.name, f.read(), ImageLimits(), f.label).row() for f in folder_images(root)]
    contract = suggest_image_contract(rows)
    assert contract.classes == sorted(CLASSES) and contract.mode == "RGB"
    assert contract.width.min <= 32 <= contract.width.max and contract.brightness.max <= 255
    # the proposal accepts its own reference set
    prepared = prepare_images(folder_images(root), str(root), "label", ImagesParams(), PrepareParams(), contract)
    assert not prepared.refused
