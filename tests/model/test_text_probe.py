"""A text module is probed before any stage on the text modality's own batch (tasks/modalities/text/layout.py): the
built-in families and the worked example (docs/examples/own_text_model.py) pass; a module that cannot answer an empty
text (a row of padding only), one that takes the ids as floats, one that answers per token, one whose vocabulary is
short of the layout's, and one whose answer depends on its batch each fail, naming the rule; and through the real
check before any stage (tasks/training/probe_process.py, a child process) a broken text module is refused by rule
while nothing was trained."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from tasks.config import parse_params
from tasks.modalities import modality_named
from tasks.training.probe import ModelRuleBroken, probe_model
from tasks.training.probe_process import ProbeFailed, check_before_stages


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
    assert probe.inputs.dtype == torch.int64 and probe.layout.n_classes == 4
    assert probe.inputs.shape[1] == probe.layout.width == 16 + probe.layout.gram_slots
    assert not probe.inputs[0].any() and (probe.inputs[2] == 1).all()          # no token; only unknown tokens
    assert int(probe.inputs.max()) == probe.layout.vocab_size - 1


@pytest.mark.parametrize("name", ["bag", "text_transformer"])
def test_the_text_families_keep_the_contract(probe, name):
    probe_model(name, {"dim": 16} if name == "bag" else {"dim": 16, "layers": 1, "heads": 2}, probe)


def test_a_module_that_cannot_answer_an_empty_text_fails_naming_the_rule(probe, monkeypatch):
    monkeypatch.setitem(sys.modules, "own_text_nets", sys.modules[__name__])
    with pytest.raises(ModelRuleBroken, match="finite logits for every input"):
        probe_model("own_text_nets:MeanOfTokens", {}, probe, export=False)



class Floats(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.body = nn.Linear(layout.max_tokens, layout.n_classes)

    def forward(self, ids):          # forgets that its input is int64 token ids
        return self.body(ids)


class PerToken(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.tokens = nn.Embedding(layout.vocab_size, layout.n_classes)

    def forward(self, ids):          # (B, T, n_classes): one answer per token, not per text
        return self.tokens(ids)


class ShortVocabulary(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.tokens = nn.EmbeddingBag(layout.vocab_size - 1, layout.n_classes)   # the largest id is out of range

    def forward(self, ids):
        return self.tokens(ids)


class BatchCentred(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.tokens = nn.EmbeddingBag(layout.vocab_size, layout.n_classes)

    def forward(self, ids):          # each text's answer less the batch's mean: it depends on the other texts
        logits = self.tokens(ids)
        return logits - logits.mean(0, keepdim=True)


@pytest.mark.parametrize("cls, rule", [
    ("Floats", "forward(x) takes x (B, 400) int64 token ids: 16 of a text's words (0 pads the end of a text, 1 is an "
                "unknown token), then 384 of its character n-grams' (0 pads)"),
    ("PerToken", "forward returns one (B, n_classes) floating tensor of logits"),
    ("ShortVocabulary", "forward(x) takes x (B, 400) int64 token ids"),
    ("BatchCentred", "in eval mode a row's answer does not depend on the rows batched with it"),
])
def test_a_broken_text_module_is_refused_naming_the_rule(probe, monkeypatch, cls, rule):
    monkeypatch.setitem(sys.modules, "own_text_nets", sys.modules[__name__])
    with pytest.raises(ModelRuleBroken) as refused:
        probe_model(f"own_text_nets:{cls}", {}, probe, export=False)
    assert rule in str(refused.value) and "nothing was trained" in str(refused.value), str(refused.value)


def test_the_worked_example_meets_the_text_contract_and_exports(probe):
    probe_model("docs.examples.own_text_model:TinyTextCNN", {}, probe)   # raises if a rule breaks


def test_before_any_stage_a_broken_text_module_is_refused_in_the_child_by_rule(tmp_path, monkeypatch):
    """What `torchship run` calls before it writes anything or starts a stage: the child finds the module in the
    project folder, builds it on the text probe and names the broken rule."""
    (tmp_path / "own_empty_text_nets.py").write_text(textwrap.dedent('''
        from torch import nn


        class MeanOfTokens(nn.Module):
            def __init__(self, layout):
                super().__init__()
                self.tokens = nn.Embedding(layout.vocab_size, 8, padding_idx=0)
                self.head = nn.Linear(8, layout.n_classes)

            def forward(self, ids):   # an empty text is 0/0
                mask = (ids != 0).unsqueeze(-1).float()
                return self.head((self.tokens(ids) * mask).sum(1) / mask.sum(1))
    '''))
    monkeypatch.chdir(tmp_path)
    raw = {"data": {"source": "text:tickets"}, "train": {"model": "own_empty_text_nets:MeanOfTokens"}}
    with pytest.raises(ProbeFailed) as refused:
        check_before_stages(raw, raw["train"]["model"], None)
    said = str(refused.value)
    assert "finite logits for every input" in said and "int64 token ids" in said and "nothing was trained" in said, said
