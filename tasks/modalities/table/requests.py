"""Table request bodies as a client sends them (one holdout row, missing values as null): what bless's service stage
and the canary's replay post to /predict."""
from __future__ import annotations

import numpy as np
import pandas as pd


def request_rows(rows: pd.DataFrame, features: list[str], count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """`count` one-row request bodies drawn from the holdout (cycled if it is smaller), missing values as null; and
    the holdout positions they came from."""
    positions = np.resize(np.random.default_rng(seed).permutation(len(rows)), count)
    chosen = rows.iloc[positions][features]
    records = chosen.astype(object).where(chosen.notna(), None).to_dict(orient="records")
    return [{"rows": [record]} for record in records], positions
