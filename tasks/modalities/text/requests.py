"""Text request bodies as a client sends them (a holdout text as JSON): what bless's service stage and the canary's
replay post to /predict."""
from __future__ import annotations

import numpy as np


def request_texts(texts: list[str], count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """`count` one-text request bodies drawn from the holdout (cycled if it is smaller), and the holdout positions
    they came from."""
    positions = np.resize(np.random.default_rng(seed).permutation(len(texts)), count)
    return [{"texts": [texts[int(i)]]} for i in positions], positions
