"""A pretrained text encoder (tasks/modalities/text/pretrained.py), with a checkpoint the test writes itself: a small
`bag` trained on generated tickets, saved as safetensors beside its tokenizer.json, the weights' metadata naming the
tokenizer's sha256 and `train.pretrained` pinning the weights. Prepare reads the texts through THAT tokenizer instead
of fitting one (the schema carries it); the train stage's loader takes every tensor; the baseline stage's text core
fits a linear probe on the frozen encoder's features and makes it the gate's baseline, and bless holds a fine-tune
to it with an interval. A checkpoint without its tokenizer, with a missing or swapped tokenizer file, or with
changed weights is refused before any stage, naming what to do."""
from __future__ import annotations

import shutil
from functools import partial

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from models import build_model
from tasks.bless.quality import HoldoutPredictions, assess_quality, gate_baselines, gate_predictions
from tasks.config import parse_params
from tasks.core import paths
from tasks.core.artifacts import read_json, sha256_file
from tasks.core.errors import ConfigError
from tasks.core.params_spec import BaselineParams, BlessParams
from tasks.core.schema_spec import load_schema
from tasks.core.verdicts import BlessOutcome
from tasks.modalities import modality_named
from tasks.modalities.text.baseline import PROBE, TFIDF, fit_and_predict
from tasks.modalities.text.inputs import schema_tokenizer
from tasks.modalities.text.pretrained import (
    TOKENIZER_FILE,
    pretrained_tokenizer,
    write_checkpoint,
    write_run_checkpoint,
)
from tasks.modalities.text.shards import read_texts
from tasks.modalities.text.tokenizer import fit_tokenizer
from tasks.training.backbone import probe_features
from tasks.training.pretrained import load_pretrained
from tests.helpers.text_tickets import tickets, trained

BAG = {"dim": 32, "buckets": 1024}
RULES = BlessParams()   # macro-F1, the default bless metric


@pytest.fixture(scope="module")
def pretraining():
    """The encoder's own corpus: other tickets than the run's (its tokenizer is fitted on them)."""
    return tickets(600, seed=11)


@pytest.fixture(scope="module")
def encoder(pretraining):
    return trained("bag", pretraining, BAG)


@pytest.fixture(scope="module")
def pinned(encoder, pretraining, tmp_path_factory):
    return write_checkpoint(encoder.state_dict(), pretraining.tokenizer, tmp_path_factory.mktemp("encoder"))


def run_params(pinned) -> dict:
    """A text run on the generated tickets (other texts than the encoder's), starting from the checkpoint."""
    return {"data": {"source": "text:tickets"}, "text": {"generated": 400},
            "train": {"model": "bag", "model_args": {"bag": BAG}, "pretrained": pinned.model_dump()}}


@pytest.fixture(scope="module")
def project(pinned, tmp_path_factory):
    """The run's folder after its prepare stage."""
    folder = tmp_path_factory.mktemp("project")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        modality_named("text").prepare(parse_params(run_params(pinned)), "label")
    return folder


def test_prepare_reads_the_texts_through_the_checkpoints_tokenizer_not_a_fitted_one(pretraining, project, pinned,
                                                                                   monkeypatch):
    monkeypatch.chdir(project)
    schema = load_schema(paths.SCHEMA)
    assert schema_tokenizer(schema) == pretraining.tokenizer
    assert schema.inputs["tokenizer_sha256"] == pretraining.tokenizer.sha256
    metrics = read_json(paths.PREPARE_METRICS)
    assert metrics["tokenizer"] == f"pretrained, beside {pinned.path}" and "pretrained" in metrics["headline"]
    fitted = fit_tokenizer(read_texts(paths.TRAIN_SPLIT), pretraining.tokenizer.max_tokens, min_count=2)
    assert fitted.vocabulary != pretraining.tokenizer.vocabulary   # without the checkpoint, other ids


def test_the_train_stages_loader_takes_every_tensor_of_the_checkpoint(encoder, project, pinned, monkeypatch):
    monkeypatch.chdir(project)
    schema = load_schema(paths.SCHEMA)
    text = modality_named("text")
    ids = text.read_split(paths.HOLDOUT_SPLIT, schema).inputs
    model = build_model("bag", text.fit_layout(ids, schema), **BAG)
    report = load_pretrained(model, pinned)
    assert sorted(report["loaded"]) == sorted(encoder.state_dict()) and report["fresh"] == []
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(torch.from_numpy(ids)), encoder(torch.from_numpy(ids)), rtol=0, atol=0)


@pytest.fixture(scope="module")
def baselines(project, pinned):
    """The baseline stage's text core with the frozen encoder: (report, the gate's saved predictions)."""
    params = parse_params(run_params(pinned))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        schema = load_schema(paths.SCHEMA)
        return modality_named("text").baselines(params, schema, partial(probe_features, params, schema))


def test_the_linear_probe_on_the_frozen_encoder_joins_the_baselines_and_is_the_gate(baselines, project, monkeypatch):
    report, saved = baselines
    probes = {name for name in report["models"] if name.startswith(PROBE)}
    assert probes == {PROBE, PROBE + "_balanced"} and TFIDF in report["models"]
    assert report["gate"] in probes and saved["baseline"] == report["gate"] and "the gate's: linear probe" in \
        report["headline"]
    # The pretrained features carry what pretraining learnt: the same probe on a fresh encoder's is far behind.
    monkeypatch.chdir(project)
    schema, text = load_schema(paths.SCHEMA), modality_named("text")
    train, holdout = (text.read_split(path, schema) for path in (paths.TRAIN_SPLIT, paths.HOLDOUT_SPLIT))
    torch.manual_seed(1)
    fresh = build_model("bag", text.fit_layout(train.inputs, schema), **BAG).eval()
    with torch.no_grad():
        features = [fresh.embed(torch.from_numpy(split.inputs)).numpy() for split in (train, holdout)]
    untrained, _ = fit_and_predict(read_texts(paths.TRAIN_SPLIT), train.labels, read_texts(paths.HOLDOUT_SPLIT),
                                   holdout.labels, 4, BaselineParams(), False, probe=tuple(features))
    assert report["models"][PROBE]["f1_macro"] > untrained[PROBE]["f1_macro"] + 0.1, (report, untrained)


def lost_ground(labels: np.ndarray, predicted: np.ndarray, share: float) -> np.ndarray:
    """`predicted` with the first `share` of its right answers made wrong: a fine-tune behind the features it
    started from."""
    right = np.flatnonzero(predicted == labels)[: int(share * len(labels))]
    return np.where(np.isin(np.arange(len(labels)), right), (labels + 1) % 4, predicted)


def test_bless_holds_the_fine_tune_to_the_probe_with_an_interval(baselines, project, monkeypatch):
    report, saved = baselines
    monkeypatch.chdir(project)
    schema = load_schema(paths.SCHEMA)
    labels = modality_named("text").read_split(paths.HOLDOUT_SPLIT, schema).labels
    gate = gate_baselines(report)
    assert set(gate) == {PROBE, PROBE + "_balanced"}   # a fine-tune must beat the features it started from
    baseline = gate_predictions(saved, gate, RULES.metric, len(labels))
    assert baseline is not None   # the probe's own holdout predictions: what the interval is bootstrapped on
    training = {"fitted": {"model": "bag"}, "pretrained_freeze": "none"}
    behind = HoldoutPredictions(pd.DataFrame(index=range(len(labels))), labels, lost_ground(labels, baseline, 0.3),
                                None, schema.classes, baseline)
    quality = assess_quality(behind, RULES, baselines=gate, training=training)
    [reason] = quality.gate.reasons
    assert quality.outcome is BlessOutcome.BELOW_BASELINES
    assert f"the {report['gate'].replace('_', ' ')} baseline" in reason and "% CI" in reason
    assert "train.pretrained.freeze backbone" in reason
    level = HoldoutPredictions(behind.rows, labels, baseline, None, schema.classes, baseline)
    assert assess_quality(level, RULES, baselines=gate, training=training).outcome is BlessOutcome.FIRST_MODEL


@pytest.fixture
def checkpoint(pinned, tmp_path):
    """A copy of the checkpoint's folder the test may break."""
    folder = shutil.copytree(pinned.path.rsplit("/", 1)[0], tmp_path / "copy")
    return pinned.model_copy(update={"path": str(folder / "model.safetensors")})


def refusal(pretrained) -> str:
    with pytest.raises(ConfigError) as refused:
        pretrained_tokenizer(pretrained)
    return str(refused.value)


def test_a_checkpoint_that_does_not_carry_its_tokenizer_is_refused_naming_what_to_do(checkpoint, encoder,
                                                                                    pretraining, tmp_path):
    assert pretrained_tokenizer(checkpoint) == pretraining.tokenizer
    beside = tmp_path / "copy" / TOKENIZER_FILE
    other = fit_tokenizer(tickets(200, seed=12).texts["train"], pretraining.tokenizer.max_tokens, min_count=2)
    beside.write_text(other.to_json())   # another run's tokenizer: the encoder's ids would mean other tokens
    said = refusal(checkpoint)
    assert str(beside) in said and "the tokenizer changed" in said and "Put back" in said
    beside.unlink()
    assert "does not exist: keep the checkpoint's tokenizer.json beside its weights" in refusal(checkpoint)
    plain = tmp_path / "plain.safetensors"   # image-style weights: tensors only
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()}, str(plain))
    unpinned = checkpoint.model_copy(update={"path": str(plain), "sha256": sha256_file(plain)})
    assert "names no tokenizer" in refusal(unpinned) and "write_checkpoint" in refusal(unpinned)
    changed = checkpoint.model_copy(update={"path": str(plain)})   # another file under the old pin
    assert "not the pinned train.pretrained.sha256" in refusal(changed)


def test_before_any_stage_the_text_source_check_refuses_a_checkpoint_without_its_tokenizer(checkpoint, tmp_path):
    """`torchship run` checks the source (tasks/modalities/sources.py check_source) before it writes anything."""
    (tmp_path / "copy" / TOKENIZER_FILE).unlink()
    params = parse_params(run_params(checkpoint))
    with pytest.raises(ConfigError, match="does not exist: keep the checkpoint's tokenizer.json"):
        modality_named("text").check_source(params, "label")


def test_a_finished_runs_model_becomes_a_checkpoint_with_the_tokenizer_its_schema_carries(encoder, project,
                                                                                         pretraining, monkeypatch):
    monkeypatch.chdir(project)
    paths.MODEL_WEIGHTS.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": encoder.state_dict(), "modality": "text"}, paths.MODEL_WEIGHTS)   # as train writes it
    again = write_run_checkpoint(project / "encoders" / "tickets")
    assert pretrained_tokenizer(again) == pretraining.tokenizer   # the run's schema's: the checkpoint's own
    assert again.path.endswith("encoders/tickets/model.safetensors") and len(again.sha256) == 64
