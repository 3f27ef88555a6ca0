"""Where a table comes from: the seeded synthetic generator, scikit-learn's bundled sets, or a CSV or Parquet file
(plus the batches `torchship ingest` accepted)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core import paths
from tasks.core.errors import ConfigError, DataError
from tasks.core.fingerprints import md5_of
from tasks.core.params_spec import DataParams, Shift
from tasks.core.problems import Problem, raise_if_any
from tasks.modalities.table.files import read_table, require_target, table_columns

SKLEARN_PREFIX = "sklearn:"
SKLEARN_SETS = ("breast_cancer", "digits", "iris", "wine")
SYNTHETIC_TARGET = "churned"


def generate_customers(rows: int, seed: int, drift: float = 0.0, shift: Shift = "both") -> pd.DataFrame:
    """A churn-like table: mixed types, missing values, ~1:4 imbalance, a learnable non-linear signal.

    `drift` in [0, 1] is the strength of the shift `shift` names, so monitors and retrains have something to find:
    `covariate` moves the feature distributions P(x) and keeps the labelling function P(y|x) (`churn_logit` at
    concept 0); `concept` keeps P(x) and changes P(y|x); `both` (the default) does both; `none` ignores `drift`.
    Every kind draws the same random numbers in the same order, so `both` is the table this generator always made.
    """
    covariate = drift if shift in ("covariate", "both") else 0.0
    concept = drift if shift in ("concept", "both") else 0.0
    rng = np.random.default_rng(seed)
    contract = rng.choice(["monthly", "annual", "two_year"], rows,
                          p=[0.5 + 0.2 * covariate, 0.3 - 0.1 * covariate, 0.2 - 0.1 * covariate])
    plan = rng.choice(["basic", "standard", "premium", "family"], rows, p=[0.35, 0.35, 0.2, 0.1])
    region = rng.choice(["north", "south", "east", "west", "central"], rows,
                        p=np.array([0.25, 0.2, 0.2, 0.2, 0.15]) * (1 - covariate)
                        + np.array([0.1, 0.1, 0.1, 0.1, 0.6]) * covariate)
    payment = rng.choice(["card", "bank transfer", "paypal", "invoice"], rows, p=[0.4, 0.25, 0.2, 0.15])
    age = np.clip(rng.normal(42 + 8 * covariate, 12, rows), 18, 90).round()
    tenure = np.minimum(rng.exponential(30 * (1 - 0.4 * covariate), rows).round(), 120)
    monthly = rng.lognormal(np.log(65) + 0.3 * covariate, 0.35, rows).round(2)
    support_calls = rng.poisson(1.2 * (1 + covariate), rows)
    satisfaction = np.clip(rng.normal(6.5 - 1.5 * covariate, 2, rows).round(), 1, 10)
    usage_gb = rng.gamma(2.0, 8.0, rows).round(1)
    total = (tenure * monthly * rng.normal(1, 0.05, rows)).round(2)

    table = pd.DataFrame({
        "customer age": age, "tenure_months": tenure, "monthly charges ($)": monthly, "total_charges": total,
        "support_calls": support_calls.astype(float), "satisfaction": satisfaction, "data_usage_gb": usage_gb,
        "plan": plan, "region": region, "payment method": payment, "contract": contract,
    })
    churned = rng.random(rows) < 1 / (1 + np.exp(-churn_logit(table, concept)))
    table[SYNTHETIC_TARGET] = np.where(churned, "yes", "no")
    # Missing values where real exports have them (after labelling: the truth knew every value).
    for column, share in (("customer age", 0.02), ("total_charges", 0.01), ("satisfaction", 0.05),
                          ("payment method", 0.01)):
        table.loc[rng.random(rows) < share, column] = np.nan
    return table


def churn_logit(table: pd.DataFrame, concept: float = 0.0) -> np.ndarray:
    """(N,) the log-odds of churn given the features: the generator's labelling function, P(y|x). `concept` in
    [0, 1] is its concept shift (support calls stop predicting churn, central customers start to)."""
    contract, plan, payment = table["contract"], table["plan"], table["payment method"]
    return (-2.3
            + 1.1 * (contract == "monthly") - 0.9 * (contract == "two_year")
            + (0.45 - 0.9 * concept) * table["support_calls"]
            - 0.035 * table["tenure_months"]
            + 0.02 * (table["monthly charges ($)"] - 65)
            - 0.3 * (table["satisfaction"] - 6)
            + 0.9 * ((plan == "basic") & (payment == "invoice"))
            + 0.6 * np.sin(table["customer age"] / 7.0)
            + 0.5 * (table["data_usage_gb"] < 4) + 0.8 * concept * (table["region"] == "central")).to_numpy(float)


def load_sklearn(name: str) -> pd.DataFrame:
    """A dataset scikit-learn ships (no download), target column `target`."""
    if name not in SKLEARN_SETS:
        raise ConfigError(f"data.source 'sklearn:{name}' is not available; choose one of "
                          f"{', '.join('sklearn:' + s for s in SKLEARN_SETS)}.")
    from sklearn import datasets

    return getattr(datasets, f"load_{name}")(as_frame=True).frame


def default_target(data: DataParams) -> str:
    """The built-in source's own target column; a file's must be named."""
    if data.source == "synthetic":
        return SYNTHETIC_TARGET
    if data.source.startswith(SKLEARN_PREFIX):
        return "target"
    raise ConfigError(f"data.target is not set: name the label column of {data.source} "
                      "(torchship run --set data.target=<column>).")


def source_path(data: DataParams) -> Path | None:
    """The file behind data.source, or None for a built-in source."""
    if data.source == "synthetic" or data.source.startswith(SKLEARN_PREFIX):
        return None
    return Path(data.source)


def source_megabytes(path: Path) -> tuple[float, str]:
    """What reading a data file takes, in MiB, and how that was measured: its size on disk, or for Parquet what
    its rows declare (8 bytes a cell: what prepare holds at least; a few KiB of encoded runs can hold gigabytes)."""
    on_disk = path.stat().st_size / 2**20
    if path.suffix.lower() not in {".parquet", ".pq"}:
        return on_disk, "on disk"
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except Exception:   # not Parquet after all: read_table says so precisely
        return on_disk, "on disk"
    declared = meta.num_rows * meta.num_columns * 8 / 2**20
    return max(declared, on_disk), f"in memory: {meta.num_rows:,} rows x {meta.num_columns} columns"


def check_source_size(path: Path, max_mb: float) -> None:
    """Refuse, unread, a data file over data.max_source_mb (bounded memory, whatever the file claims)."""
    if not path.exists():
        return   # read_table names the missing file
    size, measured = source_megabytes(path)
    if size > max_mb:
        raise DataError(f"{path} is {size:,.0f} MiB ({measured}), over data.max_source_mb ({max_mb:g} MiB): it was not "
                        "read. Use a smaller extract, or raise the limit if this machine has the memory "
                        "(torchship run --set data.max_source_mb=...).")


def check_source(data: DataParams, target: str) -> None:
    """Refuse in a second, before Prefect or any stage starts, what the prepare stage would refuse after a
    while: a data file that is not there or over data.max_source_mb, a target column the table does not have
    (from its header)."""
    path = source_path(data)
    if path is not None:
        check_source_size(path, data.max_source_mb)
        columns, origin = table_columns(path), str(path)
    elif data.source == "synthetic":
        columns, origin = list(generate_customers(20, seed=0).columns), "synthetic"
    else:
        columns, origin = list(load_sklearn(data.source.split(":", 1)[1]).columns), data.source
    if columns is not None:
        require_target(columns, target, origin)


def load_source(data: DataParams, with_batches: bool = True) -> tuple[pd.DataFrame, str]:
    """Raw rows (plus batches accepted by `torchship ingest`) and a name for messages; file rows keep
    their line numbers as index. A file with structural problems is refused (all of them at once)."""
    raw, origin, problems = read_source(data, with_batches)
    raise_if_any(origin, problems)
    return raw, origin


def read_source(data: DataParams, with_batches: bool = True) -> tuple[pd.DataFrame, str, list[Problem]]:
    """`load_source`, leniently: the readable rows, plus the structural problems of the file (ragged rows,
    undecodable lines, repeated names), for the parse to report with the column problems in one refusal."""
    path = source_path(data)
    problems: list[Problem] = []
    if path is not None:
        check_source_size(path, data.max_source_mb)
        (raw, problems), origin = read_table(path), str(path)
    elif data.source == "synthetic":
        raw, origin = generate_customers(data.rows, data.seed, data.drift, data.shift), "synthetic"
    else:
        raw, origin = load_sklearn(data.source.split(":", 1)[1]), data.source
    batches = sorted(paths.BATCHES.glob("*.parquet")) if with_batches else []
    if not batches:
        return raw, origin, problems
    frames = [raw.astype(object)]
    for path in batches:
        batch = pd.read_parquet(path).astype(object)
        batch.index = [f"{path.name} row {i + 1}" for i in range(len(batch))]
        frames.append(batch)
    return (pd.concat(frames).where(lambda f: f.notna(), None), f"{origin} + {len(batches)} accepted batch(es)",
            problems)


def fingerprint_source(data: DataParams) -> dict:
    """What identifies the table's content: the file's md5 (or the built-in source's spec)."""
    path = source_path(data)
    return {"source": data.source, **({"md5": md5_of(path)} if path is not None and path.exists() else {})}


def source_classes(params, target: str) -> int:
    """How many classes the table's label column holds, read alone where the file allows (3 where it cannot be read:
    prepare then names the problem)."""
    try:
        if params.data.source == "synthetic":
            return 2
        source = Path(params.data.source)
        if source.suffix.lower() in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            return len(set(pq.read_table(source, columns=[target])[target].to_pylist()) - {None})
        if source.suffix.lower() == ".csv":
            return int(pd.read_csv(source, usecols=[target])[target].nunique())
        return int(load_source(params.data, with_batches=False)[0][target].nunique())
    except Exception:   # an unreadable source is prepare's to describe
        return 3
