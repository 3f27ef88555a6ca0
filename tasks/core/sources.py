"""Where raw rows come from: the seeded synthetic generator, scikit-learn's bundled sets, or a file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tasks.config import DataParams
from tasks.core.errors import ConfigError

SKLEARN_SETS = ("breast_cancer", "digits", "iris", "wine")
SYNTHETIC_TARGET = "churned"


def generate_customers(rows: int, seed: int, drift: float = 0.0) -> pd.DataFrame:
    """A churn-like table: mixed types, missing values, ~1:4 imbalance, a learnable non-linear signal.

    `drift` in [0, 1] shifts the feature distributions (covariate shift) and the way
    features map to churn (concept shift), so monitors and retrains have something to find.
    """
    rng = np.random.default_rng(seed)
    contract = rng.choice(["monthly", "annual", "two_year"], rows, p=[0.5 + 0.2 * drift, 0.3 - 0.1 * drift, 0.2 - 0.1 * drift])
    plan = rng.choice(["basic", "standard", "premium", "family"], rows, p=[0.35, 0.35, 0.2, 0.1])
    region = rng.choice(["north", "south", "east", "west", "central"], rows,
                        p=np.array([0.25, 0.2, 0.2, 0.2, 0.15]) * (1 - drift) + np.array([0.1, 0.1, 0.1, 0.1, 0.6]) * drift)
    payment = rng.choice(["card", "bank transfer", "paypal", "invoice"], rows, p=[0.4, 0.25, 0.2, 0.15])
    age = np.clip(rng.normal(42 + 8 * drift, 12, rows), 18, 90).round()
    tenure = np.minimum(rng.exponential(30 * (1 - 0.4 * drift), rows).round(), 120)
    monthly = rng.lognormal(np.log(65) + 0.3 * drift, 0.35, rows).round(2)
    support_calls = rng.poisson(1.2 * (1 + drift), rows)
    satisfaction = np.clip(rng.normal(6.5 - 1.5 * drift, 2, rows).round(), 1, 10)
    usage_gb = rng.gamma(2.0, 8.0, rows).round(1)
    total = (tenure * monthly * rng.normal(1, 0.05, rows)).round(2)

    logit = (-2.3
             + 1.1 * (contract == "monthly") - 0.9 * (contract == "two_year")
             + (0.45 - 0.9 * drift) * support_calls          # concept shift: calls stop predicting churn
             - 0.035 * tenure
             + 0.02 * (monthly - 65)
             - 0.3 * (satisfaction - 6)
             + 0.9 * ((plan == "basic") & (payment == "invoice"))
             + 0.6 * np.sin(age / 7.0)
             + 0.5 * (usage_gb < 4) + 0.8 * drift * (region == "central"))
    churned = rng.random(rows) < 1 / (1 + np.exp(-logit))

    table = pd.DataFrame({
        "customer age": age, "tenure_months": tenure, "monthly charges ($)": monthly, "total_charges": total,
        "support_calls": support_calls.astype(float), "satisfaction": satisfaction, "data_usage_gb": usage_gb,
        "plan": plan, "region": region, "payment method": payment, "contract": contract,
        SYNTHETIC_TARGET: np.where(churned, "yes", "no"),
    })
    # Missing values where real exports have them.
    for column, share in (("customer age", 0.02), ("total_charges", 0.01), ("satisfaction", 0.05), ("payment method", 0.01)):
        table.loc[rng.random(rows) < share, column] = np.nan
    return table


def load_sklearn(name: str) -> pd.DataFrame:
    """A dataset scikit-learn ships (no download), target column `target`."""
    if name not in SKLEARN_SETS:
        raise ConfigError(f"data.source 'sklearn:{name}' is not available; choose one of "
                          f"{', '.join('sklearn:' + s for s in SKLEARN_SETS)}.")
    from sklearn import datasets

    return getattr(datasets, f"load_{name}")(as_frame=True).frame


def resolve_target(data: DataParams) -> str:
    """The target column: explicit, or the built-in source's own."""
    if data.target:
        return data.target
    if data.source == "synthetic":
        return SYNTHETIC_TARGET
    if data.source.startswith("sklearn:"):
        return "target"
    raise ConfigError(f"data.target is not set: name the label column of {data.source} "
                      "(torchship run --set data.target=<column>).")


def source_path(data: DataParams) -> Path | None:
    """The file behind data.source, or None for a built-in source."""
    if data.source == "synthetic" or data.source.startswith("sklearn:"):
        return None
    return Path(data.source)
