"""bless, stage 3, service: the candidate file loaded by the real service (`python -m serving --model-file`, a child
process on 127.0.0.1: no registry, no request log), a short bounded load of one-row holdout requests from a few
client threads, and p99 latency and error rate judged against the `slo` section."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.config import SloParams
from tasks.core.errors import TorchshipError
from tasks.core.gate import GateResult
from tasks.core.procs import running_service
from tasks.core.verdicts import StageReport

WARM_UP = 10          # sequential requests before the load: the first ones pay for lazy initialisation
REQUEST_TIMEOUT_S = 5.0


def request_rows(rows: pd.DataFrame, features: list[str], count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """`count` one-row payloads drawn from the holdout (cycled if it is smaller), missing values as null; and the
    holdout positions they came from."""
    positions = np.resize(np.random.default_rng(seed).permutation(len(rows)), count)
    chosen = rows.iloc[positions][features]
    return chosen.astype(object).where(chosen.notna(), None).to_dict(orient="records"), positions


def send_load(url: str, payloads: list[dict], concurrency: int, seconds: float) -> pd.DataFrame:
    """POST each payload once to /predict from `concurrency` threads until all are sent or `seconds` pass;
    one row per request sent: its index, whether it succeeded, the client-side latency and the label answered."""
    import httpx

    pending, lock, results = iter(range(len(payloads))), threading.Lock(), []
    deadline = time.monotonic() + seconds

    def client_thread() -> None:
        with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
            while time.monotonic() < deadline:
                with lock:
                    index = next(pending, None)
                if index is None:
                    return
                started = time.perf_counter()
                try:
                    response = client.post("/predict", json={"rows": [payloads[index]]})
                    ok = response.status_code == 200
                    label = response.json()["predictions"][0]["label"] if ok else None
                except (httpx.HTTPError, ValueError, KeyError):
                    ok, label = False, None
                results.append((index, ok, (time.perf_counter() - started) * 1e3, label))   # list.append: atomic

    threads = [threading.Thread(target=client_thread, name=f"bless-load-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return pd.DataFrame(results, columns=["index", "ok", "ms", "label"]).sort_values("index", ignore_index=True)


def judge_service(figures: dict, slo: SloParams) -> GateResult:
    """Pure core: fail when the p99 of answered requests exceeds `slo.p99_ms`, the error rate exceeds
    `slo.max_error_rate`, or nothing was answered; warn when the service's answers differ from the file's own
    predictions on the same rows (it would not be serving what was judged)."""
    failures, warnings = [], []
    if figures["answered"] == 0:
        failures.append(f"none of {figures['sent']} requests was answered")
    elif figures["p99_ms"] > slo.p99_ms:
        failures.append(f"p99 {figures['p99_ms']:.1f} ms exceeds slo.p99_ms {slo.p99_ms:g}")
    if figures["error_rate"] > slo.max_error_rate:
        failures.append(f"error rate {figures['error_rate']:.2%} exceeds slo.max_error_rate {slo.max_error_rate:.2%}")
    if figures["disagreements"]:
        warnings.append(f"{figures['disagreements']} of {figures['answered']} answers differ from the file's own "
                        "predictions on the same rows")
    return GateResult.decide("service", failures, warnings, passed=(
        f"p99 {figures['p99_ms']:.1f} ms within slo.p99_ms {slo.p99_ms:g}, errors {figures['error_rate']:.2%} "
        f"within slo.max_error_rate {slo.max_error_rate:.2%}"))


def describe_load(figures: dict) -> str:
    """One line: what was sent, how fast it was answered."""
    capped = f" (capped at slo.bless_seconds: {figures['sent']} of {figures['planned']} sent)" \
        if figures["sent"] < figures["planned"] else ""
    return (f"{figures['sent']} requests from {figures['concurrency']} threads in {figures['seconds']:.1f} s{capped}: "
            f"p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, errors {figures['error_rate']:.2%}")


def load_figures(answers: pd.DataFrame, expected: list[str], planned: int, concurrency: int, seconds: float) -> dict:
    """Latency percentiles over answered requests, error rate over those sent, disagreements with `expected`."""
    answered = answers[answers["ok"]]
    latencies = answered["ms"].to_numpy() if len(answered) else np.zeros(1)
    wanted = np.asarray(expected, dtype=object)[answered["index"].to_numpy(dtype=int)]
    return {"planned": planned, "sent": len(answers), "answered": len(answered), "concurrency": concurrency,
            "seconds": seconds, "requests_per_s": len(answers) / seconds if seconds else 0.0,
            "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "max_ms": float(latencies.max()), "error_rate": 1 - len(answered) / max(1, len(answers)),
            "disagreements": int((answered["label"].to_numpy(dtype=object) != wanted).sum())}


def try_in_service(path: Path, model_name: str, payloads: list[dict], expected: list[str], slo: SloParams,
                   startup_timeout_s: float) -> StageReport:
    """The edge: start the service on the candidate file, warm it, load it, stop it; then judge."""
    try:
        with running_service(model_name, ["--model-file", str(path)], startup_timeout_s, "torchship-bless-") as url:
            send_load(url, payloads[:WARM_UP], 1, slo.bless_seconds)
            started = time.perf_counter()
            answers = send_load(url, payloads, slo.bless_concurrency, slo.bless_seconds)
            seconds = time.perf_counter() - started
    except TorchshipError as exc:   # the candidate cannot even be served
        gate = GateResult.decide("service", [f"the service did not come up on the candidate: {exc}"])
        return StageReport(stage="service", gate=gate, headline="did not start")
    figures = load_figures(answers, expected, len(payloads), slo.bless_concurrency, seconds)
    return StageReport(stage="service", gate=judge_service(figures, slo), headline=describe_load(figures),
                       details={**figures, "slo": slo.model_dump()})
