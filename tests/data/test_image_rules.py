"""The image contract's size rules in prepare's one pass (tasks/modalities/image/expectations.py rules_for,
judge_images): a side far from the set's median (`images.size_outlier`), a long thin image (`images.max_aspect`)
and a speck under `images.min_side` are each named file by file with the rule they break; and the validate stage's
leakage check on the written splits (tasks/modalities/image/splits.py validate_prepared): an exact copy of a
training image in the holdout is refused, naming both files, their splits and the rule."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.core import paths
from tasks.core.params_spec import PrepareParams
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image.contract import ImageContract, Range, image_shape
from tasks.modalities.image.expectations import LEAKAGE_RULE
from tasks.modalities.image.prepare import prepare_images
from tasks.modalities.image.shards import write_split
from tasks.modalities.image.sources import folder_images
from tests.helpers.images import CLASSES, shapes_folder

LENIENT = ImagesParams(max_bad_share=0.5)   # the run goes on, so every verdict can be read


@pytest.fixture()
def shapes(tmp_path, monkeypatch):
    """60 rendered 32x32 shapes in class folders (data/ of this test's own)."""
    monkeypatch.chdir(tmp_path)
    return shapes_folder(tmp_path / "shapes", count=60)


def add_noise(path, height: int, width: int, seed: int = 0) -> str:
    """A colour image of random pixels (never blank) at `path`; its name relative to the set."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return f"{path.parent.name}/{path.name}"


def refusals(root, params: ImagesParams, contract: ImageContract | None = None) -> dict[str, list[str]]:
    return prepare_images(folder_images(root), str(root), "label", params, PrepareParams(), contract).refused


def test_size_and_aspect_outliers_and_specks_are_each_named_with_their_rule(shapes):
    huge = add_noise(shapes / "circle" / "huge.png", 300, 300)     # > 8 x the median side of 32
    wide = add_noise(shapes / "cross" / "wide.png", 32, 160)       # 5:1, over max_aspect 4
    speck = add_noise(shapes / "square" / "speck.png", 3, 3)       # under min_side 4
    tall = add_noise(shapes / "square" / "tall.png", 20, 6)        # 3.3:1 and every side within: kept
    refused = refusals(shapes, LENIENT)
    assert set(refused) == {huge, wide, speck}
    assert refused[huge] == ["width within [4, 256]: got 300", "height within [4, 256]: got 300"]
    assert refused[wide] == ["aspect ratio at most 4: got 5"]
    assert "both sides at least 4 pixels: got 3" in refused[speck]
    assert tall not in refused


def test_the_size_rules_follow_their_params(shapes):
    big = add_noise(shapes / "circle" / "big.png", 130, 130)      # within 8x of 32, beyond 4x
    wide = add_noise(shapes / "cross" / "wide.png", 24, 120)      # 5:1, within max_aspect 6
    small = add_noise(shapes / "square" / "small.png", 6, 6)      # at min_side 4, under 8
    refused = refusals(shapes, LENIENT.model_copy(update={"size_outlier": 4.0, "max_aspect": 6.0, "min_side": 8}))
    assert set(refused) == {big, small}
    assert refused[big] == ["width within [8, 128]: got 130", "height within [8, 128]: got 130"]
    assert refused[small][0] == "both sides at least 8 pixels: got 6"
    assert wide not in refused


def test_a_contracts_size_ranges_replace_the_median_rule(shapes):
    contract = ImageContract(modality="image", classes=CLASSES, mode="RGB", width=Range(min=30, max=40),
                             height=Range(min=30, max=34), max_aspect=1.5, max_bad_share=0.5)
    taller = add_noise(shapes / "circle" / "taller.png", 40, 32)   # height 40 over the contract's 34
    oblong = add_noise(shapes / "cross" / "oblong.png", 33, 40)    # 1.21:1, every side within: kept
    refused = refusals(shapes, ImagesParams(), contract)
    assert refused == {taller: ["height within [30, 34]: got 40"]}
    assert oblong not in refused


def write_splits(prepared, splits: dict[str, pd.DataFrame], pixels: dict[str, np.ndarray]) -> None:
    paths.PREPARE.mkdir(parents=True, exist_ok=True)
    for name, path in (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT)):
        write_split(path, [(pixels[name], splits[name])], "label", image_shape(prepared.schema).shape)


def test_validate_refuses_a_training_image_copied_into_the_holdout_naming_both(shapes):
    from tasks.config import parse_params
    from tasks.modalities.image.splits import validate_prepared as validate_images

    prepared = prepare_images(folder_images(shapes), str(shapes), "label", ImagesParams(), PrepareParams())
    params = parse_params({"validate": {"min_rows": 10}})
    write_splits(prepared, prepared.splits, prepared.pixels)
    clean, _ = validate_images(params, prepared.schema)
    assert clean.status == "pass", clean.reasons

    original = prepared.splits["train"]["name"].iloc[3]
    copy = prepared.splits["train"].iloc[[3]].assign(name="elsewhere/copy.png")   # same bytes, same sha256
    splits = {**prepared.splits, "holdout": pd.concat([prepared.splits["holdout"], copy], ignore_index=True)}
    pixels = {**prepared.pixels, "holdout": np.concatenate([prepared.pixels["holdout"], prepared.pixels["train"][3:4]])}
    write_splits(prepared, splits, pixels)
    gate, rows = validate_images(params, prepared.schema)
    assert gate.status == "fail"
    [reason] = gate.reasons
    assert LEAKAGE_RULE in reason and "1 across splits" in reason
    assert f"{original} (train) = elsewhere/copy.png (holdout)" in reason
    [leak] = [row for row in rows if row["rule"] == LEAKAGE_RULE]
    assert not leak["success"] and leak["unexpected_count"] == 2
