"""bless, stage 3, service: the candidate file loaded by the real service (`python -m serving --model-file`, a child
process on 127.0.0.1: no registry, no request log), a short bounded load of one-row (or one-image) holdout requests
from a few client threads, and p99 latency and error rate judged against the `slo` section.

The SLO judges the model, not the machine: each client follows every /predict with a request to the service's own
no-op path (/health), so both see the same moments of the box. A p99 beyond slo.p99_ms is refused only when the
model's share of it is beyond it too, in a first load and in a second: the /predict p99 beyond the no-op's (its
whole interval), or the median of what each /predict took beyond the no-op right after it, or the median of the
service's own time on a request (its answer's `served_ms`: from the read body to the answer, so no queue of other
requests in it). The last two read a slow model under a saturated box, where the no-op queues behind the model's
own work on the event loop and its tail grows with it. The machine's load is recorded beside the figures."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.errors import TorchshipError
from tasks.core.gate import GateResult
from tasks.core.machine import describe_load, load_during
from tasks.core.params_spec import SloParams
from tasks.core.procs import running_service
from tasks.core.timing import confirmed, median_excess_interval, p99_excess_interval
from tasks.core.verdicts import StageReport

WARM_UP = 10          # sequential requests before the load: the first ones pay for lazy initialisation
REQUEST_TIMEOUT_S = 5.0
NO_OP = "/health"     # the service's own path that runs no model: the reference for what the box costs a request


def send_load(url: str, payloads: list[dict], concurrency: int, seconds: float) -> pd.DataFrame:
    """POST each payload once to /predict from `concurrency` threads until all are sent or `seconds` pass, each
    followed by a GET of the no-op path; one row per request sent: its index, whether it succeeded, the
    client-side latency, the label answered, the service's own time on it, and the no-op's latency right after."""
    import httpx

    pending, lock, results = iter(range(len(payloads))), threading.Lock(), []
    deadline = time.monotonic() + seconds

    def timed(call, *args, **kwargs) -> tuple[float, object]:
        started = time.perf_counter()
        try:
            answer = call(*args, **kwargs)
        except (httpx.HTTPError, ValueError, KeyError):
            answer = None
        return (time.perf_counter() - started) * 1e3, answer

    def client_thread() -> None:
        with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
            while time.monotonic() < deadline:
                with lock:
                    index = next(pending, None)
                if index is None:
                    return
                ms, answer = timed(predicted_answer, client, payloads[index])
                noop_ms, _ = timed(client.get, NO_OP)
                label, served_ms = answer or (None, np.nan)
                results.append((index, label is not None, ms, label, noop_ms, served_ms))   # list.append: atomic

    threads = [threading.Thread(target=client_thread, name=f"bless-load-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return pd.DataFrame(results, columns=["index", "ok", "ms", "label", "noop_ms", "served_ms"]).sort_values(
        "index", ignore_index=True)


def predicted_answer(client, body: dict) -> tuple[str, float] | None:
    """POST one request body (one row, or one image) to /predict: the label answered and the service's own time
    on it (ms), None when it failed."""
    response = client.post("/predict", json=body)
    if response.status_code != 200:
        return None
    answer = response.json()
    return answer["predictions"][0]["label"], float(answer.get("served_ms", np.nan))


def judge_service(figures: dict, slo: SloParams) -> GateResult:
    """Pure core: fail when the p99 of answered requests exceeds `slo.p99_ms` and so does the model's share of it
    (the p99 beyond the no-op path's, its whole interval; or the median beyond the no-op right after each; or the
    service's own median time on a request), when the error rate exceeds `slo.max_error_rate`, or when
    nothing was answered; warn when the service's answers differ from the file's own predictions on the same rows
    (it would not be serving what was judged). A p99 within the objective is never refused."""
    failures, warnings = [], []
    p99, share = figures["p99_ms"], figures.get("model_p99") or {"value": figures["p99_ms"], "low": figures["p99_ms"],
                                                                   "high": figures["p99_ms"]}
    beside = (f"the no-op {NO_OP} took {figures.get('reference_p99_ms', 0.0):.1f} ms at p99 in the same seconds, "
              f"so {share['value']:.1f} ms of it is the model's (interval {share['low']:.1f} to {share['high']:.1f}); "
              f"{describe_load(figures.get('load') or {})}")
    typical = figures.get("model_p50") or {"low": 0.0, "value": 0.0}
    served = figures.get("served_p50") or {"low": 0.0, "value": 0.0}
    slow = p99 > slo.p99_ms
    if figures["answered"] == 0:
        failures.append(f"none of {figures['sent']} requests was answered")
    elif slow and share["low"] > slo.p99_ms:
        failures.append(f"p99 {p99:.1f} ms exceeds slo.p99_ms {slo.p99_ms:g}: {beside}")
    elif slow and typical["low"] > slo.p99_ms:   # a p99 cannot be met when the median request alone misses it
        failures.append(f"p99 {p99:.1f} ms exceeds slo.p99_ms {slo.p99_ms:g}: the median request took "
                        f"{typical['value']:.1f} ms more than the no-op right after it (interval from "
                        f"{typical['low']:.1f}): that much of it is the model's; {beside}")
    elif slow and served["low"] > slo.p99_ms:    # the no-op queued behind the model's own work on the loop
        failures.append(f"p99 {p99:.1f} ms exceeds slo.p99_ms {slo.p99_ms:g}: the service itself took a median "
                        f"{served['value']:.1f} ms on a request (interval from {served['low']:.1f}), from its read "
                        f"body to its answer: that much of it is the model's; {beside}")
    if figures["error_rate"] > slo.max_error_rate:
        failures.append(f"error rate {figures['error_rate']:.2%} exceeds slo.max_error_rate {slo.max_error_rate:.2%}")
    if figures["disagreements"]:
        warnings.append(f"{figures['disagreements']} of {figures['answered']} answers differ from the file's own "
                        "predictions on the same rows")
    latency = (f"p99 {p99:.1f} ms beyond slo.p99_ms {slo.p99_ms:g} is the machine's, not the model's: {beside}"
               if slow else f"p99 {p99:.1f} ms within slo.p99_ms {slo.p99_ms:g}")
    return GateResult.decide("service", failures, warnings, passed=(
        f"{latency}, errors {figures['error_rate']:.2%} within slo.max_error_rate {slo.max_error_rate:.2%}"))


def describe_figures(figures: dict) -> str:
    """One line: what was sent, how fast it was answered."""
    capped = f" (capped at slo.bless_seconds: {figures['sent']} of {figures['planned']} sent)" \
        if figures["sent"] < figures["planned"] else ""
    return (f"{figures['sent']} requests from {figures['concurrency']} threads in {figures['seconds']:.1f} s{capped}: "
            f"p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, errors {figures['error_rate']:.2%}"
            + (f"; no-op {NO_OP} p99 {figures['reference_p99_ms']:.1f} ms" if "reference_p99_ms" in figures else "")
            + (f"; {describe_load(figures['load'])}" if figures.get("load") else ""))


def load_figures(answers: pd.DataFrame, expected: list[str], planned: int, concurrency: int, seconds: float,
                 resamples: int = 1000, confidence: float = 0.95) -> dict:
    """Latency percentiles over answered requests (and of the no-op requests beside them, with the model's share of
    the p99 and its interval), error rate over those sent, disagreements with `expected`."""
    answered = answers[answers["ok"]]
    latencies = answered["ms"].to_numpy() if len(answered) else np.zeros(1)
    wanted = np.asarray(expected, dtype=object)[answered["index"].to_numpy(dtype=int)]
    figures = {"planned": planned, "sent": len(answers), "answered": len(answered), "concurrency": concurrency,
               "seconds": seconds, "requests_per_s": len(answers) / seconds if seconds else 0.0,
               "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
               "max_ms": float(latencies.max()), "error_rate": 1 - len(answered) / max(1, len(answers)),
               "disagreements": int((answered["label"].to_numpy(dtype=object) != wanted).sum())}
    if "noop_ms" in answered and len(answered):
        reference = answered["noop_ms"].to_numpy()
        figures |= {"reference_p50_ms": float(np.percentile(reference, 50)),
                    "reference_p99_ms": float(np.percentile(reference, 99)),
                    "model_p99": p99_excess_interval(latencies, reference, resamples, confidence),
                    "model_p50": median_excess_interval(latencies, reference, resamples, confidence)}
    if "served_ms" in answered and answered["served_ms"].notna().any():
        served = answered["served_ms"].dropna().to_numpy()
        figures["served_p50"] = median_excess_interval(served, np.zeros_like(served), resamples, confidence)
    return figures


def try_in_service(path: Path, model_name: str, payloads: list[dict], expected: list[str], slo: SloParams,
                   startup_timeout_s: float, resamples: int = 1000, confidence: float = 0.95) -> StageReport:
    """The edge: start the service on the candidate file, warm it, load it (again when the first load fails),
    stop it; then judge."""
    def load(url: str) -> tuple[None, StageReport]:
        with load_during() as busy:
            started = time.perf_counter()
            answers = send_load(url, payloads, slo.bless_concurrency, slo.bless_seconds)
            seconds = time.perf_counter() - started
        figures = {**load_figures(answers, expected, len(payloads), slo.bless_concurrency, seconds, resamples,
                                  confidence), "load": busy}
        return None, StageReport(stage="service", gate=judge_service(figures, slo), headline=describe_figures(figures),
                                 details={**figures, "slo": slo.model_dump()})

    try:
        with running_service(model_name, ["--model-file", str(path)], startup_timeout_s, "torchship-bless-") as url:
            send_load(url, payloads[:WARM_UP], 1, slo.bless_seconds)
            _, report = confirmed(lambda: load(url))
    except TorchshipError as exc:   # the candidate cannot even be served
        gate = GateResult.decide("service", [f"the service did not come up on the candidate: {exc}"])
        return StageReport(stage="service", gate=gate, headline="did not start")
    return report
