"""tasks/stages/overrides.py: --set values are typed YAML, validated before anything is written, comments survive,
and the files a run or a plan touches are put back on failure (Ctrl-C and SIGTERM included) or after a look."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tasks.core.errors import ConfigError
from tasks.core.procs import Terminated
from tasks.stages.overrides import applied_overrides, merge, parse_assignment, resolve, write_params

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def params_file(tmp_path) -> Path:
    target = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", target)
    return target


@pytest.mark.parametrize("text, path, value", [
    ("train.epochs=30", ["train", "epochs"], 30),
    ("train.lr=0.5", ["train", "lr"], 0.5),
    ("train.lr=1e-3", ["train", "lr"], 1e-3),
    ("train.hidden=[64, 32]", ["train", "hidden"], [64, 32]),
    ("data.target=null", ["data", "target"], None),
    ("data.target=", ["data", "target"], None),
    ("data.source=data/My Customers.csv", ["data", "source"], "data/My Customers.csv"),
    ("validate.warn_blocks=true", ["validate", "warn_blocks"], True),
])
def test_values_are_typed_as_yaml(text, path, value):
    parsed_path, parsed = parse_assignment(text)
    assert parsed_path == path
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("text", ["train.epochs", "epochs=3", "=3", ".=3"])
def test_malformed_assignment_is_a_config_error(text):
    with pytest.raises(ConfigError, match="--set"):
        parse_assignment(text)


def test_unparseable_value_is_a_config_error():
    with pytest.raises(ConfigError, match="train.hidden"):
        parse_assignment("train.hidden=[64, 32")


def test_merge_is_deep_and_leaves_inputs_alone():
    base = {"train": {"epochs": 4, "lr": 0.1}, "data": {"rows": 10}}
    merged = merge(base, {"train": {"epochs": 9}})
    assert merged == {"train": {"epochs": 9, "lr": 0.1}, "data": {"rows": 10}}
    assert base["train"]["epochs"] == 4


def test_resolve_applies_and_validates(params_file):
    raw, params = resolve(["train.epochs=2", "train.model=mlp", "train.model_args={mlp: {hidden: [16]}}"],
                          base_file=str(params_file))
    assert raw["train"]["epochs"] == 2 and params.train.epochs == 2
    assert params.train.model_args["mlp"]["hidden"] == [16]


def test_resolve_checks_a_named_models_arguments_against_its_config(params_file):
    with pytest.raises(ConfigError, match="not arguments of mlp"):
        resolve(["train.model=mlp", "train.model_args={mlp: {layers: 3}}"], base_file=str(params_file))


def test_resolve_merges_a_params_file_before_the_sets(params_file, tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("train:\n  epochs: 7\n  lr: 0.01\n")
    _, params = resolve(["train.epochs=3"], params_file=str(extra), base_file=str(params_file))
    assert params.train.epochs == 3 and params.train.lr == 0.01


@pytest.mark.parametrize("assignment, named", [
    ("train.epoch=3", "train.epoch"),
    ("train.epochs=-1", "train.epochs"),
    ("export.onnx_exporter=foo", "export.onnx_exporter"),
])
def test_resolve_refuses_invalid_overrides_by_name(params_file, assignment, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        resolve([assignment], base_file=str(params_file))


def test_resolve_refuses_a_key_below_a_value(params_file):
    with pytest.raises(ConfigError, match="not a section"):
        resolve(["train.epochs.x=1"], base_file=str(params_file))


def test_resolve_writes_nothing(params_file):
    before = params_file.read_bytes()
    resolve(["train.epochs=2"], base_file=str(params_file))
    assert params_file.read_bytes() == before


SMALL_PARAMS = """\
# a heading comment
train:
  epochs: 4            # most epochs
  hidden: [128, 64]
  lr: 0.003
data:
  source: synthetic    # where rows come from
"""


def test_write_params_changes_only_the_value_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(SMALL_PARAMS)
    assert write_params({"train": {"epochs": 11, "hidden": [128, 64], "lr": 0.003},
                         "data": {"source": "synthetic"}}, str(path)) is True
    before, after = SMALL_PARAMS.splitlines(), path.read_text().splitlines()
    assert len(before) == len(after)
    assert [(a, b) for a, b in zip(before, after) if a != b] == [("  epochs: 4            # most epochs",
                                                                  "  epochs: 11           # most epochs")]


def test_write_params_reports_no_change(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(SMALL_PARAMS)
    assert write_params({"train": {"epochs": 4, "hidden": [128, 64], "lr": 0.003}, "data": {"source": "synthetic"}},
                        str(path)) is False
    assert path.read_text() == SMALL_PARAMS


def test_write_params_reports_no_change_for_explicit_nulls(tmp_path):
    text = "data:\n  target: null         # label column\n  rows: 100\n"
    path = tmp_path / "params.yaml"
    path.write_text(text)
    assert write_params({"data": {"target": None, "rows": 100}}, str(path)) is False
    assert path.read_text() == text


def test_write_params_keeps_the_real_params_comments(params_file):
    before = params_file.read_text()
    raw, _ = resolve(["train.epochs=11"], base_file=str(params_file))
    assert write_params(raw, str(params_file)) is True
    after = params_file.read_text()
    from ruamel.yaml import YAML

    assert YAML(typ="safe").load(after)["train"]["epochs"] == 11
    comments = [line.split("#", 1)[1] for line in before.splitlines() if "#" in line]
    assert comments and all(comment in after for comment in comments)
    _, reloaded = resolve([], base_file=str(params_file))
    assert reloaded.train.epochs == 11


@pytest.fixture
def applied(params_file, tmp_path, monkeypatch):
    """A project folder (params.yaml, no dvc.lock yet) and overrides to apply in it."""
    monkeypatch.chdir(tmp_path)  # applied_overrides works on params.yaml in the working directory
    raw, _ = resolve(["train.epochs=13"], base_file=str(params_file))
    return raw, (params_file, tmp_path / "dvc.lock"), params_file.read_bytes()


def test_a_look_restores_every_file_even_on_success(applied):
    raw, (params_file, created), before = applied
    with applied_overrides(raw, keep=False, files=(params_file, created)) as changed:
        assert changed and "epochs: 13" in params_file.read_text()
        created.write_text("made during the look")
    assert params_file.read_bytes() == before
    assert not created.exists()


def test_a_run_keeps_the_overrides_when_it_succeeds(applied):
    raw, (params_file, created), _ = applied
    with applied_overrides(raw, files=(params_file, created)):
        created.write_text("written by the run")
    assert "epochs: 13" in params_file.read_text() and created.exists()


@pytest.mark.parametrize("keep", [True, False])
def test_an_error_restores_every_file(applied, keep):
    raw, (params_file, created), before = applied
    with pytest.raises(RuntimeError), applied_overrides(raw, keep=keep, files=(params_file, created)):
        created.write_text("half done")
        raise RuntimeError("the pipeline failed")
    assert params_file.read_bytes() == before and not created.exists()


def test_ctrl_c_restores_every_file(applied):
    raw, (params_file, created), before = applied
    with pytest.raises(KeyboardInterrupt), applied_overrides(raw, files=(params_file, created)):
        raise KeyboardInterrupt
    assert params_file.read_bytes() == before


def test_sigterm_restores_every_file_and_exits_143(applied):
    raw, (params_file, created), before = applied
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as stopped, applied_overrides(raw, files=(params_file, created)):
        created.write_text("half done")
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("SIGTERM did not interrupt the block")
    assert stopped.value.code == 143
    assert params_file.read_bytes() == before and not created.exists()
    assert signal.getsignal(signal.SIGTERM) is handler, "the previous SIGTERM handler must be back"


def test_a_replaced_mapping_loses_the_keys_it_no_longer_has(params_file):
    """`--set train.model_args={}` must write model_args empty, not keep the old mapping's keys."""
    raw, _ = resolve(["train.model_args={ft_transformer: {d_token: 8, heads: 2}}"], base_file=str(params_file))
    write_params(raw, str(params_file))
    raw, params = resolve(["train.model=mlp", "train.model_args={}"], base_file=str(params_file))
    assert write_params(raw, str(params_file)) is True
    _, reloaded = resolve([], base_file=str(params_file))
    assert reloaded.train.model == "mlp" and reloaded.train.model_args == {}
