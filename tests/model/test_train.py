"""tasks/train.py's engine (tasks/training/loop.py): the trainer learns, is reproducible, resumes exactly from
a checkpoint, and its schedule and weights have the intended shape."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from sklearn.utils.class_weight import compute_class_weight

from models import build_model
from tasks.core.metrics import classification_metrics
from tasks.modalities.table.layout import fit_layout
from tasks.training.distributed import full_state
from tasks.training.loop import Trainer, class_weights, lr_at, predict_logits, train_model
from tasks.training.weights import model_spec

HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "val_accuracy", "val_f1_macro", "lr")


def train_once(encoded, params, init_seed: int = 0):
    torch.manual_seed(init_seed)
    spec = model_spec(params)
    model = build_model(spec["name"], encoded.layout, **spec["kwargs"])
    return train_model(model, encoded.train, encoded.val, params)


@pytest.fixture(scope="module")
def trained(encoded, tiny_train):
    return train_once(encoded, tiny_train)


def test_fit_beats_a_constant_predictor(encoded, trained):
    model, history = trained
    labels = encoded.val.labels.numpy()
    majority = np.bincount(labels).argmax()
    baseline = classification_metrics(labels, np.full_like(labels, majority), 2)["f1_macro"]
    scores = classification_metrics(labels, predict_logits(model, encoded.val.features).argmax(1).numpy(), 2)
    assert scores["f1_macro"] > baseline + 0.05, (scores, baseline)
    assert scores["f1_macro"] == pytest.approx(max(h["val_f1_macro"] for h in history))  # best epoch returned


def test_training_loss_goes_down(trained):
    _, history = trained
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_same_seed_same_history(encoded, tiny_train, trained):
    _, again = train_once(encoded, tiny_train)
    strip = lambda history: [{k: h[k] for k in HISTORY_KEYS} for h in history]  # noqa: E731 (samples_per_s is timing)
    assert strip(again) == strip(trained[1])


def test_other_seed_other_history(encoded, tiny_train, trained):
    _, other = train_once(encoded, tiny_train.model_copy(update={"seed": 1}), init_seed=1)
    assert [h["train_loss"] for h in other] != [h["train_loss"] for h in trained[1]]


def test_patience_stops_early(encoded, tiny_train):
    params = tiny_train.model_copy(update={"epochs": 30, "patience": 1, "lr": 1e-6, "warmup_fraction": 0.0})
    _, history = train_once(encoded, params)
    assert len(history) < 30


class Interrupted(Exception):
    pass


class StopsAtStep(Trainer):
    """Keeps the checkpoint taken at `stop_at` (through a weights-only round trip) and stops there, as a
    killed run would."""

    def __init__(self, *args, stop_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_at, self.saved = stop_at, None

    def checkpoint(self) -> None:
        if self.state.global_step == self.stop_at:
            buffer = io.BytesIO()
            torch.save(self.checkpoint_state(), buffer)
            self.saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
            raise Interrupted


def _trainer(encoded, params, init_seed: int, trainer=Trainer, **kwargs) -> Trainer:
    torch.manual_seed(init_seed)
    spec = model_spec(params)
    trainer = trainer(params, 2, **kwargs)
    trainer.setup(build_model(spec["name"], encoded.layout, **spec["kwargs"]), encoded.train, encoded.val)
    return trainer


def test_a_run_resumed_mid_epoch_from_a_checkpoint_matches_an_uninterrupted_run(encoded, tiny_train):
    params = tiny_train.model_copy(update={"epochs": 3, "checkpoint_every": 5, "model_args": {
        "mlp": {**tiny_train.model_args["mlp"], "dropout": 0.2}}})  # RNG matters
    uninterrupted = _trainer(encoded, params, init_seed=0).train()
    steps_per_epoch = -(-len(encoded.train.labels) // params.batch_size)
    stop_at = next(s for s in range(5, 3 * steps_per_epoch, 5) if s > steps_per_epoch and s % steps_per_epoch)
    killed = _trainer(encoded, params, init_seed=0, trainer=StopsAtStep, stop_at=stop_at)
    with pytest.raises(Interrupted):
        killed.train()
    assert killed.saved["loop"]["epoch"] == 1 and killed.saved["loop"]["step_in_epoch"] > 0  # mid-epoch
    resumed = _trainer(encoded, params, init_seed=7)  # other initial weights: the checkpoint must replace them
    torch.manual_seed(123)                              # other RNG: the checkpoint must restore it
    resumed.load_checkpoint_state(killed.saved)
    final = resumed.train()
    strip = lambda history: [{k: h[k] for k in HISTORY_KEYS} for h in history]  # noqa: E731
    assert strip(final.history) == strip(uninterrupted.history)
    assert all(torch.equal(final.best_state[k], uninterrupted.best_state[k]) for k in uninterrupted.best_state)


def test_the_kept_best_weights_do_not_follow_later_training():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    kept, _ = full_state(model)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    assert not torch.equal(kept["weight"], model.weight.detach())  # on the CPU, full_state must copy


def test_lr_warms_up_linearly_then_decays_by_cosine():
    total, warmup = 100, 10
    curve = [lr_at(s, total, warmup) for s in range(total + 1)]
    assert curve[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert curve[warmup] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(curve[warmup:], curve[warmup + 1:]))
    assert lr_at(warmup + (total - warmup) // 2, total, warmup) == pytest.approx(0.5)
    assert curve[total] == pytest.approx(0.0, abs=1e-12)
    assert lr_at(total + 50, total, warmup) == pytest.approx(0.0, abs=1e-12)


def test_lr_without_warmup_starts_at_the_peak():
    assert lr_at(0, 10, 0) == 1.0


def test_class_weights_are_balanced_like_sklearn():
    labels = torch.tensor([0] * 70 + [1] * 20 + [2] * 10)
    expected = compute_class_weight("balanced", classes=np.arange(3), y=labels.numpy())
    np.testing.assert_allclose(class_weights(labels, 3).numpy(), expected, rtol=1e-6)


def test_class_weights_survive_an_absent_class():
    weights = class_weights(torch.tensor([0, 0, 1]), 3)
    assert torch.isfinite(weights).all() and weights[0] < weights[1]


def test_fit_layout_uses_training_statistics(encoded):
    schema = encoded.prepared.schema
    features = encoded.train.features.numpy()
    layout = fit_layout(features, schema)
    j = schema.feature_names.index("customer age")
    position = layout.numeric_index.index(j)
    assert layout.numeric_mean[position] == pytest.approx(np.nanmean(features[:, j]), rel=1e-5)
    assert layout.numeric_std[position] == pytest.approx(np.nanstd(features[:, j]), rel=1e-5)
    plan = schema.feature_names.index("plan")
    assert layout.cardinalities[layout.categorical_index.index(plan)] == 4
    assert layout.n_classes == 2
