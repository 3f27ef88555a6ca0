"""The linear probe of a pretrained backbone: with `train.pretrained` set, the baseline stage's image core
(tasks/modalities/image/baseline.py baseline_outputs, tasks/training/backbone.py probe_features) fits a logistic
regression on the frozen backbone's features of the packaged digits, with weights the test makes itself, and makes
it the gate's baseline; and bless (tasks/bless/quality.py, tasks/bless/advice.py) refuses a fine-tune that cannot
beat it, with advice that fits how it was trained."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from tasks.bless.quality import HoldoutPredictions, assess_quality, gate_baselines, gate_predictions, judge_candidate
from tasks.core import paths
from tasks.core.errors import ConfigError
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import BaselineParams, BlessParams, Params, PretrainedParams, TrainParams
from tasks.core.verdicts import BlessOutcome
from tasks.modalities.image.baseline import PIXELS, PROBE, baseline_outputs, fit_and_predict
from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.shards import write_split
from tasks.training.backbone import probe_features
from tests.helpers.pretrained_weights import DIGITS, RESNET, WIDTHS, digits, resnet, save_weights, trained_resnet

RULES = BlessParams()   # macro-F1, the default bless metric


def image_baseline_outputs(params: Params, schema):
    """The baseline stage's image core: with train.pretrained, the linear probe on the frozen backbone joins."""
    backbone = (lambda inputs: probe_features(params, schema, inputs)) if params.train.pretrained.path else None
    return baseline_outputs(params, schema, backbone)


@pytest.fixture(scope="module")
def data():
    torch.set_num_threads(1)   # 8x8 digits: extra threads only add overhead on small CPUs
    return digits()


@pytest.fixture(scope="module")
def source(data):
    return trained_resnet(data)


@pytest.fixture(scope="module")
def pinned(source, tmp_path_factory) -> PretrainedParams:
    return save_weights(source, tmp_path_factory.mktemp("weights") / "digits.safetensors")


@pytest.fixture()
def prepared(data, tmp_path, monkeypatch):
    """The digits as the prepare stage leaves them: train and holdout shards under this test's data/."""
    monkeypatch.chdir(tmp_path)
    for name, path in (("train", paths.TRAIN_SPLIT), ("holdout", paths.HOLDOUT_SPLIT)):
        rows = pd.DataFrame({"label": [str(v) for v in data.labels[name]]})
        write_split(path, [(data.pixels[name], rows)], "label", image_shape(DIGITS).shape)
    return data


def params_with(pretrained: PretrainedParams | None, model: str = "resnet") -> Params:
    """Default params but for the model and its weights (the small ResNet's widths, as the file was trained)."""
    return Params(train=TrainParams(model=model, model_args=RESNET if model == "resnet" else {},
                                    pretrained=pretrained or PretrainedParams()))


def test_the_probe_reads_the_pretrained_backbones_embeddings(data, source, pinned):
    features = probe_features(params_with(pinned), DIGITS, data.pixels["train"])
    holdout = data.pixels["holdout"]
    with torch.no_grad():
        expected = source.embed(torch.from_numpy(holdout)).numpy()   # the saved model's own features, in eval mode
    assert features(holdout).shape == (len(holdout), WIDTHS[-1])
    np.testing.assert_allclose(features(holdout), expected, rtol=0, atol=1e-5)


def test_the_baseline_stage_fits_a_probe_on_the_frozen_features_and_gates_on_it(prepared, pinned):
    report, saved = image_baseline_outputs(params_with(pinned), DIGITS)
    probes = {name for name in report["models"] if name.startswith(PROBE)}
    assert probes == {PROBE, PROBE + "_balanced"}   # macro-F1 adds the class-balanced variants
    assert report["gate"] in probes and saved["baseline"] == report["gate"]
    holdout = prepared.labels["holdout"]
    # the saved gate predictions are the probe's: they score what the report says it scored
    scored = classification_metrics(holdout, np.asarray(saved["predicted"]), 10)[RULES.metric]
    assert saved["rows"] == len(holdout) and scored == pytest.approx(report["models"][report["gate"]][RULES.metric])
    # The pretrained features carry what training learnt: the same probe on a fresh backbone's is far behind.
    fresh = resnet(prepared.layout, seed=1).eval()
    with torch.no_grad():
        untrained, _ = fit_and_predict(prepared.pixels["train"], prepared.labels["train"], prepared.pixels["holdout"],
                                       holdout, 10, BaselineParams(), False,
                                       features=lambda p: fresh.embed(torch.from_numpy(p)).numpy())
    assert report["models"][PROBE]["accuracy"] > untrained[PROBE]["accuracy"] + 0.15


def test_without_pretrained_weights_there_is_no_probe(prepared):
    report, saved = image_baseline_outputs(params_with(None), DIGITS)
    assert not any(name.startswith(PROBE) for name in report["models"])
    assert saved["baseline"] == report["gate"] == max(report["models"], key=lambda n: report["models"][n]["f1_macro"])


NO_EMBED = '''
    from torch import nn
    from models.cnn import ImagePreprocessor


    class NoEmbed(nn.Module):
        """A classifier with no embed(x): nothing to fit a linear probe on."""
        head = "fc"

        def __init__(self, layout):
            super().__init__()
            self.preprocess = ImagePreprocessor(layout)
            self.conv = nn.Conv2d(layout.channels, 4, 3, padding=1)
            self.fc = nn.Linear(4, layout.n_classes)

        def forward(self, x):
            return self.fc(self.conv(self.preprocess(x)).mean((2, 3)))
'''


@pytest.fixture()
def no_embed(tmp_path):
    """An own module, importable as own_probe_nets:NoEmbed for the test's length."""
    (tmp_path / "own_probe_nets.py").write_text(textwrap.dedent(NO_EMBED))
    sys.path.insert(0, str(tmp_path))
    module = __import__("own_probe_nets")
    yield module.NoEmbed
    sys.path.remove(str(tmp_path))
    sys.modules.pop("own_probe_nets", None)


def test_a_model_without_embed_is_refused_naming_the_rule(data, no_embed, tmp_path):
    weights = save_weights(no_embed(data.layout), tmp_path / "own.safetensors")   # its own weights: they load
    with pytest.raises(ConfigError, match=r"own_probe_nets:NoEmbed has no embed\(x\) method.*docs/own-model\.md"):
        probe_features(params_with(weights, "own_probe_nets:NoEmbed"), DIGITS, data.pixels["train"])


TRAINED = {"fitted": {"model": "resnet", "epochs": 40, "batch_size": 64, "lr": 0.003, "train_rows": 1200},
           "epochs_run": 14}


@pytest.mark.parametrize("freeze, knob", [
    ("none", "train.pretrained.freeze backbone, or a lower train.lr: the fine-tune lost to a linear classifier"),
    ("backbone", "a higher train.lr or more train.epochs: with the backbone frozen"),
])
def test_a_fine_tune_behind_its_own_probe_is_refused_with_advice(freeze, knob):
    baselines = {PIXELS: {"f1_macro": 0.89}, PROBE: {"f1_macro": 0.95}}
    training = {**TRAINED, "pretrained_freeze": freeze}
    verdict = judge_candidate({"f1_macro": 0.91}, None, True, RULES, baselines=baselines, training=training)
    [reason] = verdict.gate.reasons
    assert verdict.outcome is BlessOutcome.BELOW_BASELINES and verdict.gate.status == "fail"
    assert "below the linear probe baseline 0.9500" in reason and f"most likely to help: {knob}" in reason
    # the same fine-tune a point above its probe is blessed
    ahead = judge_candidate({"f1_macro": 0.96}, None, True, RULES, baselines=baselines, training=training)
    assert ahead.outcome is BlessOutcome.FIRST_MODEL


def test_behind_the_pixels_not_the_probe_the_advice_is_not_about_the_probe():
    baselines = {PIXELS: {"f1_macro": 0.95}, PROBE: {"f1_macro": 0.90}}
    verdict = judge_candidate({"f1_macro": 0.85}, None, True, RULES, baselines=baselines, training=TRAINED)
    assert "logistic regression pixels baseline" in verdict.gate.reasons[0]
    assert "train.pretrained" not in verdict.gate.reasons[0]


def probe_behind(labels: np.ndarray, probe: np.ndarray, share: float) -> np.ndarray:
    """The probe's own holdout predictions with `share` of its right answers made wrong: a fine-tune that lost
    ground from the features it started with."""
    rng = np.random.default_rng(0)
    right = np.flatnonzero(probe == labels)
    spoiled = rng.choice(right, int(share * len(right)), replace=False)
    candidate = probe.copy()
    candidate[spoiled] = (labels[spoiled] + 1) % 10
    return candidate


def test_bless_holds_the_fine_tune_to_the_probe_the_stage_gates_on_with_an_interval(prepared, pinned):
    report, saved = image_baseline_outputs(params_with(pinned), DIGITS)
    labels = prepared.labels["holdout"]
    baselines = gate_baselines(report)
    baseline = gate_predictions(saved, baselines, RULES.metric, len(labels))
    candidate = probe_behind(labels, np.asarray(saved["predicted"]), 0.2)
    predictions = HoldoutPredictions(pd.DataFrame(index=range(len(labels))), labels, candidate, None, DIGITS.classes,
                                     baseline)
    quality = assess_quality(predictions, RULES, baselines=baselines, training={**TRAINED, "pretrained_freeze": "none"})
    [reason] = quality.gate.reasons
    assert quality.outcome is BlessOutcome.BELOW_BASELINES
    assert f"the {report['gate'].replace('_', ' ')} baseline" in reason and "% CI" in reason
    assert "train.pretrained.freeze backbone" in reason
