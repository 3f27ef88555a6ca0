"""Public tables that ship inside installable packages (nothing is downloaded): scikit-learn's bundled sets,
palmerpenguins' CSV and statsmodels' datasets, each as (raw frame, target column), the way a user would hand
torchship a CSV. bench/bench_tables.py runs them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class PublicTable:
    name: str
    about: str
    load: Callable[[], pd.DataFrame]
    target: str
    source: str       # data.source of the equivalent `torchship run`, or the CSV the bench would write


def sklearn_table(name: str) -> pd.DataFrame:
    from tasks.modalities.table.sources import load_sklearn

    return load_sklearn(name)


def penguins() -> pd.DataFrame:
    """palmerpenguins' bundled CSV: island and sex categorical, 11 rows with missing values."""
    from palmerpenguins import load_penguins

    return load_penguins()


def anes96() -> pd.DataFrame:
    """1996 American National Election Study: vote (Clinton 0 / Dole 1) from attitudes and demographics; party ID,
    education and income are ordinal codes, kept numeric (as a user's CSV would have them)."""
    from statsmodels.datasets import anes96 as data

    frame = data.load_pandas().data.drop(columns=["logpopul"])   # log of another column: nothing new
    return frame.assign(vote=frame["vote"].map({0.0: "clinton", 1.0: "dole"}))


def fair() -> pd.DataFrame:
    """Fair's 1978 affairs survey (6,366 women): any affair (affairs > 0) from marriage and background; occupation
    and the husband's occupation are category codes, so they are given as text (categorical)."""
    from statsmodels.datasets import fair as data

    frame = data.load_pandas().data
    return frame.drop(columns=["affairs"]).assign(
        occupation=frame["occupation"].map(lambda v: f"occ{int(v)}"),
        occupation_husb=frame["occupation_husb"].map(lambda v: f"occ{int(v)}"),
        affair=(frame["affairs"] > 0).map({True: "yes", False: "no"}))


MODES = {1.0: "air", 2.0: "train", 3.0: "bus", 4.0: "car"}


def modechoice() -> pd.DataFrame:
    """Greene's travel mode choice (210 travellers between Sydney and Melbourne): the mode chosen (air, train, bus,
    car) from each mode's waiting time, cost, travel time and generalised cost (one row per traveller, 16 columns)
    with household income and party size."""
    from statsmodels.datasets import modechoice as data

    long = data.load_pandas().data.assign(mode=lambda f: f["mode"].map(MODES))
    wide = long.pivot(index="individual", columns="mode", values=["ttme", "invc", "invt", "gc"])
    wide.columns = [f"{mode}_{measure}" for measure, mode in wide.columns]
    wide = wide.drop(columns=["car_ttme"])   # always 0: the car has no terminal
    chosen = long[long["choice"] == 1].set_index("individual")
    return wide.join(chosen[["hinc", "psize", "mode"]]).reset_index(drop=True)


TABLES = {t.name: t for t in (
    PublicTable("iris", "scikit-learn iris (150 rows, numeric, 3 classes)", lambda: sklearn_table("iris"),
                "target", "sklearn:iris"),
    PublicTable("wine", "scikit-learn wine (178 rows, numeric, 3 classes)", lambda: sklearn_table("wine"),
                "target", "sklearn:wine"),
    PublicTable("modechoice", "statsmodels modechoice (210 travellers, 17 numeric, 4 modes chosen)", modechoice,
                "mode", "modechoice.csv"),
    PublicTable("penguins", "palmerpenguins (344 rows, island and sex categorical, missing values, 3 classes)",
                penguins, "species", "penguins.csv"),
    PublicTable("breast_cancer", "scikit-learn breast cancer (569 rows, numeric, binary)",
                lambda: sklearn_table("breast_cancer"), "target", "sklearn:breast_cancer"),
    PublicTable("anes96", "statsmodels anes96 (944 rows, numeric and ordinal codes, binary vote)", anes96, "vote",
                "anes96.csv"),
    PublicTable("digits", "scikit-learn digits (1,797 rows, 64 numeric, 10 classes)",
                lambda: sklearn_table("digits"), "target", "sklearn:digits"),
    PublicTable("fair", "statsmodels fair (6,366 rows, 2 categorical occupations, binary: any affair)", fair,
                "affair", "fair.csv"),
)}
