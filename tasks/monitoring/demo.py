"""`torchship demo drift`: real traffic from the synthetic generator (normal, then drifted) through a real
service, with the generator's true outcomes posted back as feedback labels, so the monitor has a window to
judge and a retrain has labelled rows to learn from."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params
from tasks.core.procs import running_service
from tasks.modalities.table.sources import SYNTHETIC_TARGET, generate_customers

ROWS_PER_REQUEST = 50


@contextlib.contextmanager
def running_demo_service(params: Params) -> Iterator[str]:
    """The project's service with the project's request log (the canary's keeps its own, in a temporary folder)."""
    flags = ["--request-log", params.serve.request_log or "data/serve/requests.jsonl"]
    with running_service(params.data.registered_model_name(), flags, params.canary.startup_timeout_s,
                         "torchship-demo-") as url:
        yield url


class DemoTraffic:
    def __init__(self, url: str, params: Params):
        import httpx

        self.client = httpx.Client(base_url=url, timeout=30.0)
        self.params = params
        self.pending: list[dict] = []   # feedback not yet posted: {"id", "label"}
        self.last_served = self.last_labelled = None   # the newest ids sent: the log holds them once flushed

    def send(self, rows: int, drift: float, seed: int) -> str:
        """Serve `rows` generated rows in requests of ROWS_PER_REQUEST; the truths wait for send_feedback."""
        table = generate_customers(rows, seed, drift, self.params.data.shift)
        truths = table.pop(SYNTHETIC_TARGET).astype(str).tolist()
        records = table.astype(object).where(table.notna(), None).to_dict(orient="records")
        served, versions = 0, {}
        for start in range(0, len(records), ROWS_PER_REQUEST):
            response = self.client.post("/predict", json={"rows": records[start:start + ROWS_PER_REQUEST]})
            response.raise_for_status()
            body = response.json()
            versions[body["version"]] = versions.get(body["version"], 0) + len(body["predictions"])
            for prediction, truth in zip(body["predictions"], truths[start:start + ROWS_PER_REQUEST]):
                self.pending.append({"id": prediction["id"], "label": truth})
            served += len(body["predictions"])
            self.last_served = body["predictions"][-1]["id"]
        return f"served {served} rows (drift {drift:g}) by version(s) {versions}"

    def send_feedback(self) -> str:
        posted = 0
        for start in range(0, len(self.pending), 500):
            response = self.client.post("/feedback", json={"labels": self.pending[start:start + 500]})
            response.raise_for_status()
            posted += response.json()["accepted"]
        self.last_labelled = self.pending[-1]["id"] if self.pending else self.last_labelled
        self.pending.clear()
        return f"posted {posted} feedback labels"

    def wait_logged(self, timeout: float = 30.0) -> None:
        """The service writes its logs every serve.log_flush_seconds: wait (bounded) until the newest served row
        and the newest label sent are in them (a log that held rows before the demo must not satisfy this)."""
        import time

        from tasks.monitoring.segments import local_source
        from tasks.monitoring.window import read_feedback, read_lines

        log = Path(self.params.serve.request_log)
        source = local_source(log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            newest = read_lines(source.served(), 1, 0.0)
            served = self.last_served is None or (newest and newest[-1]["id"] == self.last_served)
            if served and (self.last_labelled is None or self.last_labelled in read_feedback(source.feedback())):
                return
            time.sleep(0.2)
        raise TorchshipError(f"the service did not write its request log within {timeout:.0f}s ({log})")

    def health_after_aliases_settle(self) -> dict:
        """/health once the service follows the registry's aliases (it polls every serve.poll_seconds)."""
        import time

        from tasks.registry.read import aliases, registry_client

        current = aliases(registry_client(self.params.tracking), self.params.data.registered_model_name())
        deadline = time.monotonic() + 3 * self.params.serve.poll_seconds + 5
        while True:
            health = self.client.get("/health").json()
            if (health.get("champion") == current.get("champion")
                    and health.get("challenger") == current.get("challenger")
                    or time.monotonic() > deadline):
                return health
            time.sleep(0.5)
