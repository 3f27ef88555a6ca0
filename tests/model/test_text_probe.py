"""A text module is probed before any stage on the text modality's own batch (tasks/modalities/text/layout.py): the
built-in families pass; a module that cannot answer an empty text (a row of padding only) fails, naming the rule."""
from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from tasks.config import parse_params
from tasks.modalities import modality_named
from tasks.training.probe import ModelRuleBroken, probe_model


class MeanOfTokens(nn.Module):
    """Divides by the count of real tokens without a floor: an empty text is 0/0."""

    def __init__(self, layout):
        super().__init__()
        self.tokens = nn.Embedding(layout.vocab_size, 8, padding_idx=0)
        self.head = nn.Linear(8, layout.n_classes)

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).float()
        return self.head((self.tokens(ids) * mask).sum(1) / mask.sum(1))


@pytest.fixture(scope="module")
def probe():
    params = parse_params({"data": {"source": "text:tickets"}, "text": {"tokenizer": {"tokens_per_text": 16}}})
    return modality_named("text").model_probe(params, 4)


def test_the_probe_batch_holds_an_empty_text_and_every_id(probe):
    assert probe.inputs.dtype == torch.int64 and probe.inputs.shape[1] == 16 and probe.layout.n_classes == 4
    assert not probe.inputs[0].any() and (probe.inputs[2] == 1).all()          # no token; only unknown tokens
    assert int(probe.inputs.max()) == probe.layout.vocab_size - 1


@pytest.mark.parametrize("name", ["bag", "text_transformer"])
def test_the_text_families_keep_the_contract(probe, name):
    probe_model(name, {"dim": 16} if name == "bag" else {"dim": 16, "layers": 1, "heads": 2}, probe)


def test_a_module_that_cannot_answer_an_empty_text_fails_naming_the_rule(probe, monkeypatch):
    monkeypatch.setitem(sys.modules, "own_text_nets", sys.modules[__name__])
    with pytest.raises(ModelRuleBroken, match="finite logits for every input"):
        probe_model("own_text_nets:MeanOfTokens", {}, probe, export=False)
