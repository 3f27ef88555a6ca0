"""Image request bodies as a client sends them (a holdout image as a base64 PNG file): what bless's service stage
and the canary's replay post to /predict."""
from __future__ import annotations

import base64

import numpy as np

from tasks.modalities.image.decode import encode_png


def request_images(pixels: np.ndarray, count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """`count` one-image request bodies drawn from the holdout (cycled if it is smaller), and the holdout positions
    they came from."""
    positions = np.resize(np.random.default_rng(seed).permutation(len(pixels)), count)
    encoded = {int(i): base64.b64encode(encode_png(pixels[i])).decode() for i in np.unique(positions)}
    return [{"images": [encoded[int(i)]]} for i in positions], positions
