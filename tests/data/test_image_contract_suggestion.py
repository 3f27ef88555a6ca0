"""`torchship contract suggest DIR` proposes a contract that accepts every decodable image of DIR: its ranges span the
observed min and max, then widen (not the 1st and 99th percentiles, which cut the tail of whichever class holds it).
And at prepare, a range rule that refuses a share of one class far above the others is named in a warning."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image
from ruamel.yaml import YAML

from tasks.config import parse_params
from tasks.core.params_spec import PrepareParams
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image.prepare import prepare_images
from tasks.modalities.image.sources import folder_images
from tests.helpers.images import shapes_folder
from tests.unit.test_image_cli import cli  # noqa: F401 - the CLI in a bare project folder, its environment put back

BRIGHT = 3   # circles far brighter than the rest of the set: the tail a percentile would cut


@pytest.fixture()
def reference(tmp_path, request):
    """400 shapes (100 a class) of which BRIGHT circles are brightened far above the rest, and their suggested
    contract, from the CLI run in a project folder of its own."""
    invoke = request.getfixturevalue("cli")
    root = shapes_folder(tmp_path / "shapes", count=400, side=16)
    for path in sorted((root / "circle").glob("*.png"))[:BRIGHT]:
        pixels = np.asarray(Image.open(path), dtype=np.int16)
        Image.fromarray((pixels + 150).clip(0, 255).astype(np.uint8)).save(path)
    result = invoke("contract", "suggest", str(root))
    assert result.exit_code == 0, result.output
    return root, parse_params(YAML(typ="safe").load(result.stdout), origin="suggested").contract


def test_the_suggested_contract_accepts_every_image_it_was_suggested_from(reference):
    reference, contract = reference
    prepared = prepare_images(folder_images(reference), str(reference), "label", ImagesParams(), PrepareParams(),
                              contract)
    assert not prepared.refused, prepared.refused


def test_a_rule_that_cuts_one_class_is_named_in_a_warning(reference, caplog):
    reference, contract = reference
    cut = contract.model_copy(update={"brightness": contract.brightness.model_copy(update={"max": 150.0})})
    with caplog.at_level(logging.WARNING, logger="torchship.prepare"):
        prepared = prepare_images(folder_images(reference), str(reference), "label", ImagesParams(), PrepareParams(),
                                  cut)
    assert len(prepared.refused) == BRIGHT
    warned = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
    assert any("brightness within" in w and "class 'circle'" in w and f"{BRIGHT} of the 100" in w for w in warned), \
        [r.getMessage() for r in caplog.records]
