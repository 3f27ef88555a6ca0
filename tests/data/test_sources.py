"""tasks/modalities/table/sources.py: the seeded synthetic generator, scikit-learn's sets, and the target rules
(tasks/modalities/sources.py resolve_target)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tasks.core.params_spec import DataParams
from tasks.core.errors import ConfigError
from tasks.config import parse_params
from tasks.modalities.sources import resolve_target
from tasks.modalities.table.sources import SYNTHETIC_TARGET, churn_logit, generate_customers, load_sklearn, source_path


def test_same_seed_same_table(customers):
    pd.testing.assert_frame_equal(generate_customers(1500, seed=3), customers)


def test_other_seed_other_table(customers):
    other = generate_customers(1500, seed=4)
    assert not other.equals(customers)
    assert list(other.columns) == list(customers.columns)


def test_shape_types_and_label_values(customers):
    assert len(customers) == 1500
    assert set(customers[SYNTHETIC_TARGET]) == {"yes", "no"}
    assert customers["plan"].dtype == object and customers["customer age"].dtype == np.float64


def test_positive_share_is_a_minority(customers):
    share = (customers[SYNTHETIC_TARGET] == "yes").mean()
    assert 0.1 < share < 0.4


def test_has_missing_values_where_exports_have_them(customers):
    nulls = customers.isna().sum()
    assert nulls["customer age"] > 0 and nulls["satisfaction"] > 0 and nulls["payment method"] > 0
    assert nulls[SYNTHETIC_TARGET] == 0


def test_drift_shifts_age_up_and_changes_churn():
    reference, drifted = generate_customers(4000, seed=11), generate_customers(4000, seed=11, drift=1.0)
    assert drifted["customer age"].mean() - reference["customer age"].mean() > 5  # +8 years by construction
    churn = lambda table: (table[SYNTHETIC_TARGET] == "yes").mean()  # noqa: E731
    assert abs(churn(drifted) - churn(reference)) > 0.03
    assert (drifted["region"] == "central").mean() > 2 * (reference["region"] == "central").mean()


def test_drift_zero_is_the_reference_distribution():
    pd.testing.assert_frame_equal(generate_customers(300, seed=5, drift=0.0), generate_customers(300, seed=5))


def test_each_shift_moves_what_it_names():
    features = lambda shift: generate_customers(2000, 9, 0.6, shift).drop(columns=[SYNTHETIC_TARGET])  # noqa: E731
    pd.testing.assert_frame_equal(features("covariate"), features("both"))    # the same P(x) move
    pd.testing.assert_frame_equal(features("concept"), features("none"))      # P(x) stays
    pd.testing.assert_frame_equal(generate_customers(2000, 9, 0.6, "none"), generate_customers(2000, 9))
    assert not features("covariate").equals(features("none"))


def worst_calibration_gap(shift: str) -> float:
    """The largest gap, over deciles of the unshifted labelling function's churn probability, between that
    probability and the churn rate of a table generated at drift 0.6 with `shift`."""
    table = generate_customers(20_000, 8, 0.6, shift).dropna(subset=["customer age", "satisfaction", "payment method"])
    churn = 1 / (1 + np.exp(-churn_logit(table)))
    churned = (table[SYNTHETIC_TARGET] == "yes").to_numpy()
    deciles = pd.qcut(churn, 10, labels=False)
    return max(abs(churned[deciles == d].mean() - churn[deciles == d].mean()) for d in range(10))


def test_covariate_shift_keeps_the_labelling_and_concept_shift_changes_it():
    # P(y|x) unchanged: rows at every level of the old churn probability still churn at that rate (within the
    # sampling noise of ~1,800 rows a decile); under concept shift the top deciles churn ~0.1-0.2 less
    assert worst_calibration_gap("covariate") < 0.035
    assert worst_calibration_gap("concept") > 0.1


def test_sklearn_digits_has_ten_classes_and_a_target_column():
    digits = load_sklearn("digits")
    assert "target" in digits.columns
    assert digits["target"].nunique() == 10 and len(digits) == 1797


def test_unknown_sklearn_set_is_a_config_error():
    with pytest.raises(ConfigError, match="sklearn:digits"):
        load_sklearn("mnist")


@pytest.mark.parametrize("source, target, expected", [
    ("synthetic", None, "churned"),
    ("sklearn:iris", None, "target"),
    ("data/rows.csv", "label", "label"),
    ("synthetic", "plan", "plan"),
])
def test_resolve_target(source, target, expected):
    assert resolve_target(parse_params({"data": {"source": source, "target": target}})) == expected


def test_a_file_needs_an_explicit_target():
    with pytest.raises(ConfigError, match="data.target"):
        resolve_target(parse_params({"data": {"source": "data/rows.csv"}}))


def test_source_path_only_for_files():
    assert source_path(DataParams(source="synthetic")) is None
    assert source_path(DataParams(source="sklearn:wine")) is None
    assert source_path(DataParams(source="data/rows.parquet")) == Path("data/rows.parquet")
