"""How a canary reaches a service: its admin endpoints (the split), /health, /metrics and its logs; and the
embedded default's own service and replayed traffic (holdout rows under fresh request keys, with their labels
posted as feedback)."""
from __future__ import annotations

import contextlib
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from tasks.canary.observe import Scrape
from tasks.core.env import KEY_HEADER, TOKEN_ENV
from tasks.core.errors import TorchshipError
from tasks.core.procs import running_service


class ServiceUnreachable(TorchshipError):
    """The service did not answer, or refused the admin token."""


@dataclass
class ServiceClient:
    """A running service the canary drives: `url`, the admin `token` it was started with, and its request log
    (shadow answers and feedback are beside it)."""

    url: str
    token: str
    request_log: Path

    def _call(self, method: str, path: str, **params) -> dict:
        import httpx

        try:
            response = httpx.request(method, f"{self.url}{path}", params=params or None, timeout=30.0,
                                     headers={"Authorization": f"Bearer {self.token}"})
        except httpx.HTTPError as exc:
            raise ServiceUnreachable(f"the service at {self.url} did not answer {path}: {exc}. Is it running?") from exc
        if response.status_code in (401, 403):
            raise ServiceUnreachable(f"the service at {self.url} refused {path} ({response.status_code}: "
                                     f"{response.text[:200]}): pass the token it was started with ({TOKEN_ENV}).")
        response.raise_for_status()
        return response.json() if path != "/metrics" else {"text": response.text}

    def health(self) -> dict:
        return self._call("GET", "/health")

    def split(self, share: float, shadow: bool) -> dict:
        return self._call("POST", "/admin/share", share=share, shadow=str(shadow).lower())

    def scrape(self) -> Scrape:
        return Scrape.parse(self._call("GET", "/metrics")["text"])

    def wait_serving(self, champion: str, challenger: str, timeout_s: float) -> None:
        """Until the service serves exactly these versions (it follows the aliases; a reload asks it now)."""
        deadline = time.monotonic() + timeout_s
        while True:
            health = self._call("POST", "/admin/reload")
            if (health.get("champion"), health.get("challenger")) == (champion, challenger):
                return
            if time.monotonic() > deadline:
                raise ServiceUnreachable(
                    f"the service at {self.url} serves champion v{health.get('champion')} and challenger "
                    f"v{health.get('challenger')}, not v{champion} and v{challenger}, after {timeout_s:g} s "
                    "(canary.startup_timeout_s): is it serving this registry and model? (its log says why a "
                    "version did not load)")
            time.sleep(0.5)


class ReplayTraffic:
    """Bounded replay: holdout rows in turn, one request each under a fresh key (so the sticky split spreads them
    like users), the true label posted as feedback for each answered row."""

    def __init__(self, url: str, bodies: list[dict], truth: list[str]):
        """`bodies`: one-item /predict bodies as a client sends them (the modality's: tasks/modalities/), `truth`
        their labels."""
        import httpx

        self.client = httpx.Client(base_url=url, timeout=30.0)
        self.bodies = [orjson.dumps(body) for body in bodies]
        self.rows = len(self.bodies)   # distinct rows: a step judges at most this many pairs
        self.truth = [str(label) for label in truth]
        self.sent = 0

    def send(self, count: int) -> int:
        """`count` requests, then one feedback post for those answered; returns how many were sent."""
        import httpx

        labels = []
        for _ in range(count):
            index = self.sent % len(self.bodies)
            headers = {"content-type": "application/json", KEY_HEADER: f"replay-{self.sent}"}
            self.sent += 1
            try:
                response = self.client.post("/predict", content=self.bodies[index], headers=headers)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                labels.append({"id": response.json()["predictions"][0]["id"], "label": self.truth[index]})
        if labels:
            self.client.post("/feedback", json={"labels": labels})
        return count

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def embedded_service(model_name: str, startup_timeout_s: float) -> Iterator[ServiceClient]:
    """A real `python -m serving` on a free loopback port for the canary (tasks/core/procs.py running_service): its
    own request log in a temporary folder (replayed rows are not production traffic), a one-off admin token,
    share 0; stopped on every way out."""
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="torchship-canary-") as folder:
        request_log = Path(folder) / "requests.jsonl"
        flags = ["--challenger-share", "0", "--request-log", str(request_log), "--ship-to", "", "--poll-seconds", "1",
                 "--seed", "0"]
        with running_service(model_name, flags, startup_timeout_s, "torchship-canary-", env={TOKEN_ENV: token}) as url:
            yield ServiceClient(url, token, request_log)
