"""Starting from pretrained weights (tasks/training/pretrained.py): a safetensors file the test makes itself, pinned by
its sha256, loads tensor for tensor into a fresh model of the same family; a changed file, a pickle, another model's
weights and a frozen backbone the file does not cover are refused before anything is loaded; a head of another class
count starts fresh; and `freeze: backbone`, through the train stage's own trainer, trains the head alone while the
backbone's batch-norm statistics stay as they were saved."""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from torch import nn

from docs.examples.own_image_model import TinyCNN
from models import build_model
from tasks.core.errors import ConfigError
from tasks.core.params_spec import PretrainedParams, TrainParams
from tasks.training.distributed import Runtime
from tasks.training.pretrained import head_of, load_pretrained
from tests.helpers.pretrained_weights import RESNET, WIDTHS, digits, resnet, save_weights, sha256_of, trained_resnet

HEAD = {"fc.weight", "fc.bias"}


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


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's state that later training or loading does not change."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def same(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor], names) -> bool:
    """Whether the two states hold exactly equal tensors under every one of `names`."""
    return all(torch.equal(left[name], right[name]) for name in names)


def test_the_pinned_file_loads_every_tensor_and_the_model_answers_as_the_one_saved(data, source, pinned):
    model, saved = resnet(data.layout, seed=1), load_file(pinned.path)
    assert not same(snapshot(model), saved, saved)   # a fresh model differs: the test can see a load
    report = load_pretrained(model, pinned)
    assert sorted(report["loaded"]) == sorted(saved) and report["fresh"] == [] and report["unused"] == []
    assert same(snapshot(model), snapshot(source), saved)   # batch-norm statistics and preprocessing included
    holdout = torch.from_numpy(data.pixels["holdout"])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(holdout), source(holdout), rtol=0, atol=0)
    assert all(parameter.requires_grad for parameter in model.parameters())   # freeze none: everything trains


def test_a_file_whose_sha256_is_not_the_pinned_one_is_refused_and_nothing_is_loaded(data, pinned, tmp_path):
    other = save_weights(resnet(data.layout, seed=2), tmp_path / "digits.safetensors")   # retrained, same name
    stale = pinned.model_copy(update={"path": other.path})
    model = resnet(data.layout, seed=1)
    before = snapshot(model)
    with pytest.raises(ConfigError) as refusal:
        load_pretrained(model, stale)
    message = str(refusal.value)
    assert other.path in message and other.sha256 in message and pinned.sha256 in message
    assert "was not loaded" in message and "pin its sha256" in message
    assert same(snapshot(model), before, before)


def test_weights_are_pinned_in_params():
    with pytest.raises(ValidationError, match="sha256sum"):
        PretrainedParams(path="weights.safetensors")
    with pytest.raises(ValidationError):
        PretrainedParams(path="weights.safetensors", sha256="not-a-digest")


def test_only_safetensors_files_are_read(data, source, tmp_path):
    pickle = tmp_path / "digits.pt"
    torch.save(source.state_dict(), pickle)
    rightly_pinned = PretrainedParams(path=str(pickle), sha256=sha256_of(pickle))   # the format alone is refused
    with pytest.raises(ConfigError, match=r"only \.safetensors files are read .*save_file"):
        load_pretrained(resnet(data.layout, seed=1), rightly_pinned)
    renamed = tmp_path / "digits.safetensors"
    shutil.copy(pickle, renamed)
    with pytest.raises(ConfigError, match=f"{renamed} is not a readable safetensors file"):
        load_pretrained(resnet(data.layout, seed=1), PretrainedParams(path=str(renamed), sha256=sha256_of(renamed)))
    with pytest.raises(ConfigError, match="does not exist"):
        load_pretrained(resnet(data.layout, seed=1), PretrainedParams(path=str(tmp_path / "gone.safetensors"),
                                                                          sha256="0" * 64))


@pytest.mark.parametrize("other", ["mlp", "tiny_cnn"])
def test_another_models_weights_are_refused(data, tmp_path, other):
    """An MLP shares no name; the own-module TinyCNN shares only the preprocessing statistics and a head of the same
    size, which is no backbone."""
    foreign = (nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)) if other == "mlp"
               else TinyCNN(data.layout, channels=WIDTHS[-1] // 2))
    weights = save_weights(foreign, tmp_path / f"{other}.safetensors")
    model = resnet(data.layout, seed=1)
    before = snapshot(model)
    shared = {name for name, tensor in load_file(weights.path).items()
              if name in before and before[name].shape == tensor.shape}
    assert shared == (set() if other == "mlp" else {"preprocess.mean", "preprocess.scale", "preprocess.offset"} | HEAD)
    with pytest.raises(ConfigError, match="another model's weights") as refusal:
        load_pretrained(model, weights)
    assert weights.path in str(refusal.value) and "the model has e.g. ['stages.0." in str(refusal.value)
    assert same(snapshot(model), before, before)


def test_a_head_of_another_class_count_starts_fresh(data, pinned):
    model = resnet(replace(data.layout, n_classes=4), seed=1)
    before, saved = snapshot(model), load_file(pinned.path)
    report = load_pretrained(model, pinned)
    assert set(report["fresh"]) == HEAD and set(report["loaded"]) == set(saved) - HEAD
    after = snapshot(model)
    assert same(after, before, HEAD) and same(after, saved, set(saved) - HEAD)
    assert model(torch.from_numpy(data.pixels["holdout"][:3])).shape == (3, 4)


def test_freeze_backbone_leaves_only_the_head_trainable(data, pinned):
    model = resnet(data.layout, seed=1)
    load_pretrained(model, pinned.model_copy(update={"freeze": "backbone"}))
    assert {name for name, p in model.named_parameters() if p.requires_grad} == HEAD


def test_the_head_is_the_declared_one_else_the_last_linear_layer(data):
    assert head_of(TinyCNN(data.layout)) == "fc"
    assert head_of(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))) == "2"
    misnamed = TinyCNN(data.layout)
    misnamed.head = "classifier"
    with pytest.raises(ConfigError, match="'classifier', which names no module"):
        head_of(misnamed)
    with pytest.raises(ConfigError, match="no Linear layer and no `head`"):
        head_of(nn.Sequential(nn.Conv2d(1, 2, 3)))


def test_a_frozen_backbone_the_file_does_not_cover_is_refused(data, pinned):
    """Two blocks a stage where the file has one: the extra blocks would stay frozen at their random start."""
    deeper = build_model("resnet", data.layout, widths=WIDTHS, blocks=2)
    before = snapshot(deeper)
    with pytest.raises(ConfigError, match="never leave their random start"):
        load_pretrained(deeper, pinned.model_copy(update={"freeze": "backbone"}))
    assert same(snapshot(deeper), before, before)
    assert load_pretrained(deeper, pinned)["fresh"]   # unfrozen, what matches loads and the rest trains


def train_from(pinned: PretrainedParams, data, tmp_path, monkeypatch) -> nn.Module:
    """Two epochs through the train stage's own trainer (tasks/training/job.py start_trainer), in this process."""
    from tasks.training import job

    monkeypatch.setattr(job, "job_fingerprint", lambda _: "test")   # the real one hashes the prepared splits on disk
    settings = TrainParams(model="resnet", model_args=RESNET, epochs=2, batch_size=64, lr=0.01, patience=2, seed=0,
                           adapt=False, checkpoint_every=0, pretrained=pinned)
    training = job.TrainingJob(stage="train", train=settings, spec={}, weights=tmp_path / "model.pt",
                               checkpoints=tmp_path / "checkpoints", folder=tmp_path, logs=tmp_path, pretrained=pinned)
    runtime = Runtime(device=torch.device("cpu"), backend="gloo", precision="fp32", precision_note="", rank=0, world=1,
                      local_rank=0)
    model = resnet(data.layout, seed=1)
    trainer = job.start_trainer(training, runtime, 10, model, data.split("train"), data.split("val"))
    trainer.train()
    trainer.close()
    return model


def test_a_frozen_backbone_trains_the_head_alone_and_keeps_its_batch_norm_statistics(data, pinned, tmp_path,
                                                                                       monkeypatch):
    saved = load_file(pinned.path)
    backbone = set(saved) - HEAD
    statistics = {name for name in backbone if ".running_" in name or name.endswith("num_batches_tracked")}
    assert statistics   # the ResNet has batch norms: what the frozen backbone must not re-estimate
    frozen = snapshot(train_from(pinned.model_copy(update={"freeze": "backbone"}), data, tmp_path / "frozen",
                                 monkeypatch))
    assert same(frozen, saved, backbone) and not same(frozen, saved, {"fc.weight"})
    # The same training unfrozen moves the backbone and its statistics: what `freeze: backbone` prevents.
    unfrozen = snapshot(train_from(pinned, data, tmp_path / "unfrozen", monkeypatch))
    assert not same(unfrozen, saved, {"stem.0.weight"}) and not same(unfrozen, saved, {"stem.1.running_mean"})
