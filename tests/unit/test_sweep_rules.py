"""The sweep's rules in memory: what may be searched, trial 0's held values, the budget every worker counts, the
pruning hook, when a finalist may be registered, the own-module probe before any stage, and how the team stack hands
the study database to its clients (no password anywhere but the secrets file and PGPASSWORD)."""
from __future__ import annotations

import json
import os
import subprocess

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from flows.cli.stack.lifecycle import shell_env
from flows.cli.stack.servers import client_env
from flows.cli.stack.state import SWEEP_DB_SECRET, StackPaths, StackState, load_secrets
from flows.cli.sweep import check_own_models
from tasks.core.errors import ConfigError
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params, SearchRange
from tasks.core.verdicts import Blessing, BlessOutcome
from tasks.sweep import space
from tasks.sweep.report import accepts, ranked, shared_work
from tasks.sweep.study import REASON, STOP, STORAGE_ENV, TRIAL, WAIT, Tally, next_move, storage_url, tally
from tasks.sweep.workspace import own_code_env
from tasks.training.pruning import SWEEP_TRIAL_ENV, Pruned, epoch_reporter

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_split_defining_unknown_and_unsearchable_keys_are_refused_and_model_args_are_free():
    ranges = {key: SearchRange(low=1, high=2) for key in
              ("data.rows", "prepare.seed", "prepare.holdout_fraction", "bless.max_regression", "train.no_such_key")}
    with pytest.raises(ConfigError) as refused:
        space.check_space(ranges, Params())
    said = str(refused.value)
    assert all(key in said for key in ranges), said
    assert "defines the splits" in said and "is no param" in said
    space.check_space({"train.lr": SearchRange(low=0.001, high=0.1, log=True),
                       "train.model_args.mlp.hidden": SearchRange(choices=[[64], [128, 64]]),
                       "prepare.max_categories": SearchRange(low=10, high=50)}, Params())


def test_a_range_needs_bounds_in_order_or_choices():
    for bad in ({"low": 1}, {"low": 2, "high": 1}, {"low": 0, "high": 1, "log": True}, {"low": 0, "high": 1,
                                                                                         "choices": [1]}):
        with pytest.raises(ValueError):
            SearchRange(**bad)


def test_trial_0_holds_what_no_range_holds_and_draws_the_rest_from_the_sampler():
    ranges = {"train.lr": SearchRange(low=0.001, high=0.1, log=True), "train.epochs": SearchRange(low=2, high=9),
              "train.model_args.mlp.hidden": SearchRange(choices=[[64], [128, 64]])}
    fits, held = space.enqueued(ranges, {"train.lr": None, "train.epochs": 8, "train.model_args.mlp.hidden": [64]})
    assert held == {"train.lr": None} and fits == {"train.epochs": 8, "train.model_args.mlp.hidden": "[64]"}
    drawn = space.draw(optuna.trial.FixedTrial(fits), ranges, held)
    assert drawn == {"train.lr": None, "train.epochs": 8, "train.model_args.mlp.hidden": [64]}
    raw = space.with_values({"train": {"epochs": 3}}, drawn)
    assert raw["train"] == {"epochs": 8, "model_args": {"mlp": {"hidden": [64]}}}   # lr unset: the model's own


def trials(*states: TrialState, reason: bool = False) -> list:
    made = []
    for state in states:
        attrs = {REASON: "crashed"} if reason and state == TrialState.FAIL else {}
        value = 0.5 if state == TrialState.COMPLETE else None
        made.append(create_trial(state=state, value=value, user_attrs=attrs,
                                 params={"x": 0.1}, distributions={"x": FloatDistribution(0, 1)}))
    return made


def test_the_budget_counts_recorded_failures_but_not_a_dead_workers_trial():
    assert tally(trials(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)) == Tally(2, 0, 0)
    assert tally(trials(TrialState.COMPLETE, TrialState.FAIL, reason=True)) == Tally(2, 0, 0)
    assert tally(trials(TrialState.RUNNING, TrialState.WAITING)) == Tally(0, 1, 1)


@pytest.mark.parametrize("counts, budget, time_left, move", [
    (Tally(0, 0, 1), 4, True, TRIAL),     # trial 0 queued
    (Tally(2, 1, 0), 4, True, TRIAL),     # room left
    (Tally(3, 1, 0), 4, True, WAIT),      # the last one runs: it ends, or goes stale and comes back queued
    (Tally(3, 1, 1), 4, True, TRIAL),     # a dead worker's trial came back: take it
    (Tally(4, 0, 0), 4, True, STOP),
    (Tally(1, 0, 0), 4, False, STOP),     # out of time
])
def test_the_next_move(counts, budget, time_left, move):
    assert next_move(counts, budget, time_left) == move


def test_a_storage_url_with_a_password_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHSHIP_SWEEP_STORAGE", "postgresql+psycopg2://u:secret@127.0.0.1:5432/optuna")
    with pytest.raises(ConfigError, match="PGPASSWORD"):
        storage_url(tmp_path)
    monkeypatch.delenv("TORCHSHIP_SWEEP_STORAGE")
    assert storage_url(tmp_path) == f"sqlite:///{tmp_path.resolve()}/.sweep/studies.db"


def blessing(status: str, outcome: BlessOutcome) -> Blessing:
    return Blessing(gate=GateResult(gate="bless", status=status, reasons=["because"]), outcome=outcome,
                    model_name="m", candidate_path="x", candidate_sha256="0", candidate_metrics={"f1_macro": 0.5},
                    champion_version="1")


@pytest.mark.parametrize("status, outcome, require_better, accepted", [
    ("pass", BlessOutcome.BETTER, True, True),
    ("pass", BlessOutcome.FIRST_MODEL, True, True),
    ("pass", BlessOutcome.NO_WORSE, True, False),     # the winner's curse: no gain shown on the holdout
    ("pass", BlessOutcome.NO_WORSE, False, True),
    ("pass", BlessOutcome.UNCHANGED, False, False),   # the champion's own file
    ("warn", BlessOutcome.WORSE_WITHIN_TOLERANCE, False, False),
    ("fail", BlessOutcome.BELOW_BASELINES, False, False),
])
def test_a_finalist_is_registered_only_when_bless_passes_it(status, outcome, require_better, accepted):
    assert accepts(blessing(status, outcome), require_better)[0] is accepted


def test_finalists_come_in_validation_order_and_shared_work_is_counted():
    made = trials(TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED)
    for number, (trial, value) in enumerate(zip(made, (0.6, 0.7, None))):
        trial.number, trial.value = number, value
        trial.set_user_attr("stages", {"prepare": "skipped", "validate": "skipped"})
        trial.set_user_attr("holdout_sha256", "abc")
    assert [t.number for t in ranked(made)] == [1, 0]
    template = {"stages": {"prepare": "ran", "validate": "ran"}, "holdout_sha256": "abc"}
    assert shared_work(made, template) == {"trials": 3, "prepare_runs": 1, "validate_runs": 1, "holdout_hashes": 1}


def test_the_pruning_hook_reports_each_epoch_and_stops_a_trial_below_the_median(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for value in (0.8, 0.82):   # two finished trials set the median at epoch 1
        trial = study.ask()
        trial.report(value, 1)
        study.tell(trial, value)
    trial = study.ask()
    spec = {"storage": storage, "study": "s", "trial_id": trial._trial_id, "metric": "f1_macro", "pruner": "median",
            "startup_trials": 2, "warmup_epochs": 0}
    assert epoch_reporter("train", 0, True) is None   # no sweep: nothing reports
    monkeypatch.setenv(SWEEP_TRIAL_ENV, json.dumps(spec))
    assert epoch_reporter("train", 1, True) is None and epoch_reporter("distill", 0, True) is None
    assert epoch_reporter("train", 0, False) is None   # cross-validated members
    reporter = epoch_reporter("train", 0, True)
    with pytest.raises(Pruned, match="pruned by the sweep at epoch 1"):
        reporter.report({"epoch": 1, "val_f1_macro": 0.5})
    assert study.trials[-1].intermediate_values == {1: 0.5}


def test_a_null_for_a_key_the_params_do_not_name_leaves_it_unset_and_a_named_null_stays():
    raw = {"train": {"lr": None, "epochs": 3}}
    merged = space.with_values(raw, {"train.lr": None, "train.seed": None, "train.model_args.mlp.hidden": None,
                                     "train.epochs": 5})
    assert merged == {"train": {"lr": None, "epochs": 5}} and raw["train"]["epochs"] == 3


def test_a_trials_stages_find_your_own_module_in_the_project_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert own_code_env(tmp_path) == {"PYTHONPATH": f"{tmp_path.resolve()}{os.pathsep}/elsewhere"}


def test_sweep_probes_your_own_modules_before_any_stage_as_run_does(monkeypatch):
    probed = []
    monkeypatch.setattr("tasks.training.probe_process.check_before_stages",
                        lambda raw, model, pretrained: probed.append((raw["train"]["model"], model)))
    raw = {"train": {"model": "mlp"}, "sweep": {"space": {"train.model": {"choices": [
        "mlp", "linear", "docs.examples.own_table_model:ResidualMLP"]}}}}
    check_own_models(raw, Params.model_validate(raw))
    assert probed == [("mlp", "mlp"), ("docs.examples.own_table_model:ResidualMLP",
                                       "docs.examples.own_table_model:ResidualMLP")]


def test_the_stack_hands_clients_the_study_database_by_url_and_its_own_roles_password(tmp_path):
    paths = StackPaths(tmp_path)
    secrets = load_secrets(paths, {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "abc"})
    StackState(ports={"postgres": 5, "moto": 2, "mlflow": 3, "prefect": 4}).save(paths)
    env = client_env({"postgres": 5, "moto": 2, "mlflow": 3, "prefect": 4}, secrets)
    assert env[STORAGE_ENV] == "postgresql+psycopg2://torchship_sweep@127.0.0.1:5/optuna"
    lines = shell_env(paths)
    assert not [name for name, value in secrets.items() if value in lines]   # read from the file at eval time
    shell = subprocess.run(["bash", "-c", f"{lines}\nenv -0"], capture_output=True, text=True, check=True,
                           env={"PATH": os.environ["PATH"]})
    exported = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
    # the sweep role's password, not the one that owns MLflow's and Prefect's databases
    assert exported["PGPASSWORD"] == secrets[SWEEP_DB_SECRET] != secrets["PGPASSWORD"]
    assert exported[STORAGE_ENV] == env[STORAGE_ENV]
