"""tasks/config.py: params.yaml loads, typos and bad values are refused by name, docs stay generated."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tasks.config import load_params, parse_params
from tasks.core.errors import ConfigError
from tasks.core.params_spec import DataParams, Params, TrainParams
from tasks.workspace.config_docs import configuration_markdown

REPO = Path(__file__).resolve().parents[2]


def test_repo_params_file_loads_and_matches_its_raw_values():
    from ruamel.yaml import YAML

    params = load_params(REPO / "params.yaml")
    raw = YAML(typ="safe").load((REPO / "params.yaml").read_text())
    assert isinstance(params, Params)
    assert params.train.epochs == raw["train"]["epochs"]
    assert params.train.model == raw["train"]["model"]
    assert params.validate_.min_rows == raw["validate"]["min_rows"]


def test_typo_key_is_refused_naming_the_key_and_the_known_keys():
    with pytest.raises(ConfigError) as caught:
        parse_params({"train": {"epoch": 3}})
    message = str(caught.value)
    assert "'train.epoch'" in message
    for known in TrainParams.model_fields:
        assert known in message


def test_unknown_section_is_refused():
    with pytest.raises(ConfigError, match="trian"):
        parse_params({"trian": {"epochs": 3}})


def test_bad_literal_names_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as caught:
        parse_params({"export": {"onnx_exporter": "foo"}})
    message = str(caught.value)
    assert "export.onnx_exporter" in message
    assert "'dynamo'" in message and "'legacy'" in message
    assert "'foo'" in message


def test_out_of_range_value_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"prepare\.val_fraction"):
        parse_params({"prepare": {"val_fraction": 0.7}})


def test_splits_must_leave_training_rows():
    with pytest.raises(ConfigError, match="20%"):
        parse_params({"prepare": {"val_fraction": 0.45, "holdout_fraction": 0.45}})


def test_validate_section_is_reached_by_its_yaml_name():
    assert parse_params({"validate": {"min_rows": 7}}).validate_.min_rows == 7


@pytest.mark.parametrize("source, expected", [
    ("synthetic", "synthetic-churn"),
    ("sklearn:digits", "sklearn-digits"),
    ("data/My Customers.csv", "my-customers"),
    ("exports/Q3 churn (final).parquet", "q3-churn-final"),
])
def test_registered_model_name_is_derived_from_the_source(source, expected):
    assert DataParams(source=source).registered_model_name() == expected


def test_explicit_model_name_wins():
    assert DataParams(source="sklearn:iris", model_name="flowers").registered_model_name() == "flowers"


def test_configuration_docs_are_generated_from_the_model():
    assert (REPO / "docs" / "configuration.md").read_text() == configuration_markdown()


def test_configuration_docs_list_every_key():
    text = configuration_markdown()
    for section_name, section_field in Params.model_fields.items():
        key = section_field.alias or section_name
        if section_name == "contract":  # optional, free-form per column: documented as a whole
            assert "## `contract`" in text and "on_violation" in text
            continue
        for name in section_field.annotation.model_fields:
            assert f"`{key}.{name}`" in text


def test_model_args_are_checked_against_their_models():
    """Airtight: arguments are keyed by model name and each entry is checked against its model's Config (in its
    file in models/), so a key is never silently ignored, nor applied to a model `auto` picked instead."""
    from tasks.training.model_args import check_model_args, chosen_model_kwargs

    def checked(train: dict) -> TrainParams:
        params = parse_params({"train": train}).train
        check_model_args(params)
        return params

    params = checked({"model": "mlp", "model_args": {"mlp": {"hidden": [16]}, "ft_transformer": {}}})
    assert chosen_model_kwargs(params) == {"hidden": [16], "embedding_dim": 8, "dropout": 0.1}
    assert chosen_model_kwargs(checked({"model": "ft_transformer"}))["d_token"] == 32  # defaults
    with pytest.raises(ConfigError) as caught:
        checked({"model_args": {"ft_transformer": {"hidden": [16]}}})
    assert "not arguments of ft_transformer" in str(caught.value) and "d_token" in str(caught.value)
    with pytest.raises(ConfigError, match="multiple of heads"):
        checked({"model_args": {"ft_transformer": {"d_token": 10, "heads": 4}}})
    with pytest.raises(ConfigError, match="dropout"):
        checked({"model_args": {"mlp": {"dropout": 1.5}}})
    with pytest.raises(ConfigError, match="keyed by model name"):
        parse_params({"train": {"model_args": {"hidden": [16]}}})
    with pytest.raises(ConfigError, match="unknown model 'transformer'"):
        checked({"model": "transformer"})
    user = checked({"model": "mypackage.nets:MyNet", "model_args": {"mypackage.nets:MyNet": {"width": 3}}})
    assert chosen_model_kwargs(user) == {"width": 3}


def test_loading_params_never_imports_torch():
    """The models' Configs are checked apart from the params: most steps and the service load params without
    ever importing torch (seconds at every start)."""
    code = ("import sys; from tasks.config import parse_params; import tasks.modalities.table.parse; "
            "import tasks.registry.read; "
            "parse_params({'train': {'model': 'mlp', 'model_args': {'mlp': {'hidden': [8]}}}}); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('models')))")
    shown = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"
