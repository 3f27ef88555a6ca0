"""Training that fits the table: `auto` picks by rows, small tables get enough optimizer steps, and the
default data keeps params.yaml's values (pure rules; what they buy on a real table is measured in
bench/results/auto_model.json and bench/results/tables.json)."""
from __future__ import annotations

import pytest

from tasks.config import default_params
from tasks.core.params_spec import TrainParams
from tasks.training.adapt import (
    GPU_MAX_BATCH,
    GPU_MIN_STEPS_PER_EPOCH,
    MIN_BATCHES_PER_EPOCH,
    fit_training,
    fitted_settings,
)
from tasks.training.model_args import chosen_model_kwargs

pytestmark = pytest.mark.model


def test_a_small_table_gets_a_smaller_batch_and_enough_steps():
    fitted = fit_training(TrainParams(cv_max_rows=0), 1257)   # digits' training split, one validation split
    assert fitted.model == "mlp" and fitted.lr == 3e-3
    assert fitted.batch_size == 64 and fitted.steps_per_epoch >= MIN_BATCHES_PER_EPOCH
    assert fitted.epochs * fitted.steps_per_epoch >= TrainParams().min_steps
    assert fitted.patience > TrainParams().patience   # early stopping stretched with the epochs
    assert any("auto picked mlp" in reason for reason in fitted.reasons)


def test_the_default_data_keeps_the_params_values():
    fitted = fit_training(TrainParams(), 70_000)
    assert (fitted.model, fitted.batch_size, fitted.epochs, fitted.patience, fitted.lr) == (
        "ft_transformer", 512, 8, 3, 1e-3)
    assert fitted.reasons == ["auto picked ft_transformer: 70,000 training rows >= train.ft_min_rows 5,000"]


def test_everything_stays_overridable():
    exact = TrainParams(model="ft_transformer", adapt=False, batch_size=256, epochs=2, lr=0.01, cv_max_rows=0)
    fitted = fit_training(exact, 300)
    assert (fitted.model, fitted.batch_size, fitted.epochs, fitted.lr, fitted.reasons) == (
        "ft_transformer", 256, 2, 0.01, [])
    capped = fit_training(TrainParams(max_epochs=20), 300)
    assert capped.epochs == 20 and capped.batch_size == 32
    assert fit_training(TrainParams(ft_min_rows=0, cv_max_rows=0), 300).model == "ft_transformer"


def test_fitted_settings_leave_nothing_to_resolve():
    settings = fitted_settings(TrainParams(), fit_training(TrainParams(), 1257))
    assert settings.model == "mlp" and settings.lr == 3e-3 and not settings.adapt
    assert chosen_model_kwargs(settings)["hidden"] == [128, 64]   # MLPConfig's defaults
    assert fit_training(settings, 1257) == fit_training(settings, 1257)   # idempotent: workers agree


def test_below_the_cv_threshold_auto_compares_families_on_fold_sized_schedules():
    fitted = fit_training(TrainParams(), 1257)
    assert fitted.folds == 5 and fitted.candidates == {"linear": 1e-2, "mlp_plr": 3e-3}   # each family's own lr
    assert fitted.train_rows == 1257 and fitted.steps_per_epoch == -(-(1257 - 1257 // 5) // fitted.batch_size)
    assert any("auto compares linear, mlp_plr" in reason for reason in fitted.reasons)
    explicit = fit_training(TrainParams(model="mlp", lr=0.02), 1257)
    assert explicit.folds == 5 and explicit.candidates == {"mlp": 0.02}   # an explicit model: members, no choice
    assert fit_training(TrainParams(), 2000).folds == 1 and fit_training(TrainParams(), 2000).candidates == {}


def test_the_distilled_student_stays_one_network_on_a_small_table():
    from tasks.training.distill import student_settings

    assert fit_training(student_settings(default_params()), 300).folds == 1


def test_on_a_gpu_a_large_table_gets_a_larger_batch_and_the_learning_rate_with_it():
    """1M rows (700k training): batch 512 left an H200 waiting on kernel launches."""
    cpu, gpu = fit_training(TrainParams(), 700_000, "cpu"), fit_training(TrainParams(), 700_000, "cuda")
    assert (cpu.batch_size, cpu.lr) == (512, 1e-3)
    assert gpu.batch_size == 4096 and gpu.steps_per_epoch >= GPU_MIN_STEPS_PER_EPOCH
    assert gpu.lr == pytest.approx(1e-3 * (4096 / 512) ** 0.5)
    assert gpu.epochs * gpu.steps_per_epoch >= TrainParams().min_steps
    assert gpu.reasons[1:] == ["batch 512 -> 4096 on a GPU: an epoch keeps >= 128 steps, and a small batch leaves "
                               "the GPU waiting on kernel launches", "lr 0.001 -> 0.00282843 with the batch "
                               "(square-root scaling)"]


def test_on_a_gpu_the_default_data_and_small_tables_keep_their_batch():
    assert fit_training(TrainParams(), 70_000, "cuda") == fit_training(TrainParams(), 70_000, "cpu")
    assert fit_training(TrainParams(cv_max_rows=0), 1257, "cuda").batch_size == 64
    assert fit_training(TrainParams(), 100_000_000, "cuda").batch_size == GPU_MAX_BATCH


def test_on_a_gpu_an_exact_schedule_stays_exact():
    exact = TrainParams(adapt=False, batch_size=256, lr=0.01)
    assert (fit_training(exact, 700_000, "cuda").batch_size, fit_training(exact, 700_000, "cuda").lr) == (256, 0.01)
    explicit = fit_training(TrainParams(lr=0.002), 700_000, "cuda")
    assert explicit.lr == pytest.approx(0.002 * 8 ** 0.5)   # an explicit lr was set for batch_size: it scales too
