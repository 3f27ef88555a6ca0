"""Live traffic for a running service, in a thread: what a canary on it observes (test_canary_live.py, the journey's
serving host)."""
from __future__ import annotations

import base64
import random
import threading

import httpx
import numpy as np
import pandas as pd

from tasks.core.env import KEY_HEADER
from tasks.modalities.image.decode import encode_png


class LiveTraffic:
    """Users sending rows (holdout rows, or drifted ones), each under a key of its own (so the split is sticky), and
    the true labels as feedback, in a thread, until stopped: the live traffic a canary observes."""

    def __init__(self, url: str, features: pd.DataFrame | np.ndarray | list[str], truth: pd.Series,
                 pause_s: float = 0.0):
        """`features`: rows' feature columns, images ((N, H, W, C) uint8, sent as base64 PNG files), or texts.
        `pause_s`: the users' pause after each ten requests (0: as fast as the service answers)."""
        self.url, self.stop_event, self.pause_s = url, threading.Event(), pause_s
        if isinstance(features, list):
            self.bodies = [{"texts": [text]} for text in features]
        elif isinstance(features, np.ndarray):
            self.bodies = [{"images": [base64.b64encode(encode_png(image)).decode()]} for image in features]
        else:
            rows = features.astype(object).where(features.notna(), None).to_dict(orient="records")
            self.bodies = [{"rows": [row]} for row in rows]
        self.truth = truth.tolist()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = random.Random(0)
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stop_event.is_set():
                labels = []
                for _ in range(10):
                    i = rng.randrange(len(self.bodies))
                    answer = http.post("/predict", json=self.bodies[i],
                                       headers={KEY_HEADER: f"user-{rng.randrange(10_000)}"})
                    if answer.status_code == 200:
                        labels.append({"id": answer.json()["predictions"][0]["id"], "label": self.truth[i]})
                if labels:
                    http.post("/feedback", json={"labels": labels})
                self.stop_event.wait(self.pause_s)

    def __enter__(self) -> LiveTraffic:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
