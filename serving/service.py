"""The service's state and behaviour without HTTP: the registry client, the router over the live variants,
metrics, the request log, and the alias poller that hot-swaps a variant when its alias moves."""
from __future__ import annotations

import gc
import logging
import random
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, create_model

from serving.metrics import Metrics
from serving.request_log import RequestLog
from serving.shipper import log_shipper
from serving.variants import NoChampion, Router, SharedShare, Variant, bytes_variant, file_variant
from serving.watcher import RegistryWatcher
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.refusals import BodyRefused, RowsRefused, validate_rows
from tasks.core.runtime import EMBEDDING
from tasks.core.servelog import feedback_line, feedback_path, row_id, served_bytes, shadow_path
from tasks.registry.read import CHALLENGER, CHAMPION

log = logging.getLogger("torchship.serving")
STOP_TIMEOUT_S = 10.0   # how long shutdown waits for the watcher (it may be downloading a version)
PROBABILITY_DIGITS = 6  # in the request log: the monitor needs no more, and full float reprs lengthen every line
EMBEDDING_DIGITS = 4    # an image's embedding projection in the log: drift tests need no more


def settle_heap() -> None:
    """Collect, then freeze what is left (the libraries, the loaded models) out of the garbage collector's sight:
    a full collection over it stalls the event loop ~0.2 s, often enough to set the p99 (bench/results/serving.json)."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class ServiceSettings:
    """What a service runs with: the `serve` params section (CLI flags already applied), the model and the
    registry it serves, and the two run-time options that are not params."""

    serve: ServeParams
    model_name: str
    tracking: TrackingParams
    seed: int | None = None   # of the traffic split: a canary replays reproducibly
    # this host's modality sections (`images`, ...) as plain values: their limits only tighten a model's own
    host: dict[str, dict] = field(default_factory=dict)
    model_file: Path | None = None   # serve this ONNX file as the champion: no registry, poller or logs (bless)
    share_file: Path | None = None   # serve.workers > 1: the challenger share every worker maps (SharedShare)

    @property
    def request_log(self) -> Path | None:
        """Where served rows go; an empty `serve.request_log` (or a model file) turns the log off."""
        return Path(self.serve.request_log) if self.serve.request_log and self.model_file is None else None

    def to_json(self) -> str:
        """These settings as JSON (handed to worker processes)."""
        return orjson.dumps({"serve": self.serve.model_dump(), "model_name": self.model_name,
                             "tracking": self.tracking.model_dump(), "seed": self.seed,
                             "host": self.host,
                             "model_file": str(self.model_file) if self.model_file else None,
                             "share_file": str(self.share_file) if self.share_file else None}).decode()

    @classmethod
    def from_json(cls, text: str) -> ServiceSettings:
        raw = orjson.loads(text)
        paths = {k: Path(raw[k]) if raw[k] else None for k in ("model_file", "share_file")}
        return cls(**{**raw, **paths, "serve": ServeParams.model_validate(raw["serve"]),
                      "tracking": TrackingParams.model_validate(raw["tracking"])})

    def open_log(self, path: Path | None) -> RequestLog:
        """A buffered, rotated log on `path` with the `serve.log_*` settings."""
        return RequestLog(path, flush_seconds=self.serve.log_flush_seconds,
                          rotate_bytes=int(self.serve.log_rotate_mb * (1 << 20)),
                          rotate_seconds=self.serve.log_rotate_hours * 3600.0)


@dataclass(frozen=True)
class Accepted:
    """A request whose rows passed the answering variant's schema, not yet scored."""

    variant: Variant
    rows: object   # the decoded items, of the variant's modality (its decoder's)
    body: bytes      # kept for the shadow variant, which parses it by its own schema
    started: float   # perf_counter at arrival: served_ms and the latency metric
    content_type: str | None = None   # multipart uploads of images are parsed by it


class FeedbackRefused(RowsRefused):
    """Feedback labels that are malformed or not a class of the champion; `problems` name item, field and rule
    (a 422 like refused rows: the app's RowsRefused handler answers both)."""


class FeedbackOff(RuntimeError):
    """Feedback was sent to a service that keeps no request log: its labels could never be joined."""


@lru_cache(maxsize=8)
def label_model(classes: tuple[str, ...]) -> type[BaseModel]:
    """One feedback item: {"id": <row id from a /predict answer>, "label": <one of the model's classes>}."""
    return create_model("Label", __config__=ConfigDict(extra="forbid", strict=True),
                        id=(Annotated[str, Field(min_length=1)], ...), label=(Literal[classes], ...))


class Service:
    """Champion and challenger behind one router, kept in step with the registry's aliases by a watcher process
    (serving/watcher.py: MLflow never runs in this process).

    Building one touches nothing; `start()` opens the request and feedback logs, starts the watcher and waits for
    its first poll (the aliased versions loaded and warmed); `stop()` undoes that (and writes what the logs still
    buffer)."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        shared = SharedShare(settings.share_file) if settings.share_file else None
        self.router = Router(settings.serve.challenger_share, random.Random(settings.seed), shared)
        self.metrics = Metrics()
        self.request_log = settings.open_log(settings.request_log)
        self.feedback_log = settings.open_log(feedback_path(settings.request_log) if settings.request_log else None)
        self.shadow_log = settings.open_log(shadow_path(settings.request_log) if settings.request_log else None)
        self.shipper = log_shipper(settings.serve, self.request_log, self.feedback_log)
        self.watcher = RegistryWatcher(settings.tracking, settings.model_name, settings.serve.poll_seconds,
                                       self._on_registry)

    def start(self) -> None:
        if self.settings.model_file is not None:   # a file, not the registry: nothing to poll, nothing to log
            self.router.champion = file_variant(CHAMPION, self.settings.model_file, self.settings.serve.threads,
                                                self.settings.host)
        else:
            self.request_log.open()
            self.feedback_log.open()
            self.shadow_log.open()
            self.shipper.start()
            self.watcher.start()
            if not self.watcher.poll():
                log.error("the registry watcher did not answer its first poll: serving nothing until it does")
        settle_heap()

    def stop(self) -> None:
        self.watcher.stop(STOP_TIMEOUT_S)
        self.shipper.stop()
        self.request_log.close()
        self.feedback_log.close()
        self.shadow_log.close()
        self.shipper.ship_remaining()   # after the closes: every line written, every active file sealed

    def refresh(self, retry_refused: bool = False) -> None:
        """Follow the aliases now (and, with `retry_refused`, try again a version that was refused); returns once
        what the poll found is served. A service on a model file has no aliases to follow."""
        if self.settings.model_file is None:
            self.watcher.poll(retry=retry_refused)

    def _on_registry(self, message: tuple) -> None:
        """One message of the watcher: a version to serve, one it refused, an alias gone, or a failed poll."""
        kind, *rest = message
        if kind == "failed":
            log.error("alias poll failed, retrying in %ss: %s", self.settings.serve.poll_seconds, rest[0])
        elif kind == "gone":
            if rest[0] == CHALLENGER:   # the canary ended (promoted or rolled back): all traffic to the champion
                self.router.challenger = None
        elif kind == "refused":
            self._not_loaded(*rest)
        elif kind == "version":
            self._load(*rest)
        elif kind == "champion":
            self._watch_champion(*rest)

    def _load(self, alias: str, version: str, payload: bytes) -> None:
        current: Variant | None = getattr(self.router, alias)
        if current is not None and current.version == version:
            return
        try:
            variant = bytes_variant(alias, version, payload, self.settings.serve.threads, self.settings.host)
        except Exception as exc:  # a broken new version must not take the service down
            self._not_loaded(alias, version, str(exc))
            return
        setattr(self.router, alias, variant)
        self.metrics.version.labels(alias).set(int(variant.version))
        self.metrics.reloads.labels(alias).inc()
        settle_heap()

    def _watch_champion(self, version: str | None, concern: str | None) -> None:
        """A champion bless did not pass (or one rejected) serves: a person decided it, so it serves, but the
        metric raises a ticket (serving/observability.py) until the alias moves again."""
        self.metrics.champion_unblessed.set(1 if concern else 0)
        if concern:
            log.warning("`champion` names v%s, %s: a person decided so, and it is served once it loads; see "
                        "`torchship history`", version, concern)

    def _not_loaded(self, alias: str, version: str, reason: str) -> None:
        current: Variant | None = getattr(self.router, alias)
        kept = f"v{current.version} keeps serving" if current else f"no {alias} is served"
        self.metrics.load_failures.labels(alias).inc()
        log.error("could not load %s v%s (%s): %s", alias, version, kept, reason)

    def set_share(self, share: float, shadow: bool | None = None) -> None:
        """The challenger's share of traffic and (when given) whether the other variant shadows each request."""
        self.router.share = share
        if shadow is not None:
            self.router.shadow = shadow

    def ready(self) -> bool:
        """A champion is loaded (and so warmed: variants run once before they are swapped in)."""
        return self.router.champion is not None

    def health(self) -> dict:
        champion, challenger = self.router.champion, self.router.challenger
        return {"status": "ok" if champion else "no-model", "model": self.settings.model_name,
                "champion": champion.version if champion else None,
                "challenger": challenger.version if challenger else None, "challenger_share": self.router.share,
                "shadow": self.router.shadow}

    def accept(self, body: bytes, key: bytes | None = None, content_type: str | None = None,
               variant: Variant | None = None) -> Accepted:
        """Pick the variant (sticky by the request `key` when the client sent one), unless the caller picked it, then
        parse and check the body against its schema. Raises BodyRefused, RowsRefused (naming row, field and rule) or
        NoChampion."""
        started = time.perf_counter()
        if variant is None:
            variant = self.router.pick(key)
        try:
            rows = variant.decoder.decode(body, content_type)
        except (BodyRefused, RowsRefused):
            self.metrics.counter(variant.alias, variant.version, "invalid").inc()
            raise
        return Accepted(variant, rows, body, started, content_type)

    def answer(self, accepted: Accepted, scores: np.ndarray, request_id: str) -> bytes:
        """The /predict answer for scored rows (each row gets an id, `<request_id>-<index>`, that feedback names):
        metered and logged (a canary's shadow scores it after the answer: score_shadow). JSON bytes."""
        variant = accepted.variant
        probabilities, _ = variant.split(scores)
        classes = variant.schema.classes
        labels = [classes[i] for i in variant.labels(probabilities)]
        served_ms = (time.perf_counter() - accepted.started) * 1e3
        self.metrics.latency_of(variant.alias).observe(served_ms / 1e3)
        self.metrics.counter(variant.alias, variant.version, "ok").inc()
        self.metrics.predictions.add(variant.alias, labels)
        answer = {"request_id": request_id, "variant": variant.alias, "version": variant.version,
                  "served_ms": served_ms, "predictions": [
                      {"id": row_id(request_id, i), "label": label, "probabilities": dict(zip(classes, p))}
                      for i, (label, p) in enumerate(zip(labels, probabilities.tolist()))]}
        if self.request_log.path is not None:
            self._log_served(request_id, accepted, labels, scores)
        return orjson.dumps(answer)

    def predict(self, body: bytes, request_id: str, key: bytes | None = None, content_type: str | None = None,
                variant: Variant | None = None) -> bytes:
        """accept, score and answer one request in the calling thread."""
        accepted = self.accept(body, key, content_type, variant)
        try:
            probabilities = accepted.variant.score(accepted.rows)
        except Exception:
            self.failed(accepted)
            raise
        return self.answer(accepted, probabilities, request_id)

    def failed(self, accepted: Accepted) -> None:
        """The answering variant raised while scoring accepted rows: the canary's error rate counts these."""
        self.metrics.counter(accepted.variant.alias, accepted.variant.version, "error").inc()

    def shadowing(self, accepted: Accepted) -> bool:
        """Whether this request gets a shadow answer in the shadow log (after it is answered)."""
        return (self.router.shadow and self.shadow_log.path is not None
                and self.router.other(accepted.variant) is not None)

    def score_shadow(self, accepted: Accepted, request_id: str) -> None:
        """The variant that did not answer scores the same body (by its own schema); its answer goes to the shadow
        log under the answered rows' ids, never to the client. Counted as `shadow` or `shadow-error`; not timed:
        scored in the thread pool after the answer, its time is not comparable with an answer's."""
        shadow = self.router.other(accepted.variant)
        if shadow is None:
            return
        try:
            rows = shadow.decoder.decode(accepted.body, accepted.content_type)
            probabilities = shadow.score(rows)
        except Exception as exc:  # a failing shadow must never touch the answer
            self.metrics.counter(shadow.alias, shadow.version, "shadow-error").inc()
            log.error("shadow %s v%s failed: %s", shadow.alias, shadow.version, exc)
            return
        self.metrics.counter(shadow.alias, shadow.version, "shadow").inc()
        self.shadow_log.append(self._served_lines(request_id, shadow, rows, probabilities))

    def _log_served(self, request_id: str, accepted: Accepted, labels: list[str], scores: np.ndarray) -> None:
        """One line per row, buffered: the request does not wait on the disk."""
        self.request_log.append(self._served_lines(request_id, accepted.variant, accepted.rows, scores, labels))

    @staticmethod
    def _served_lines(request_id: str, variant: Variant, rows, scores: np.ndarray,
                      labels: list[str] | None = None) -> bytes:
        """One log line per row: its features (an image's statistics and the embedding projection, never its
        pixels), the label served and the probabilities."""
        classes, features, ts = variant.schema.classes, variant.decoder.features, time.time()
        probabilities, embedding = variant.split(scores)
        labels = labels if labels is not None else [classes[i] for i in variant.labels(probabilities)]
        rounded = np.round(probabilities.astype(np.float64), PROBABILITY_DIGITS).tolist()
        projected = None if embedding is None else np.round(embedding.astype(np.float64), EMBEDDING_DIGITS).tolist()
        return b"".join(served_bytes(request_id, i, variant.alias, variant.version,
                                     features(rows, i) if projected is None else
                                     {**features(rows, i), EMBEDDING: projected[i]},
                                     label, dict(zip(classes, p)), ts=ts)
                        for i, (label, p) in enumerate(zip(labels, rounded)))

    def feedback(self, items: list) -> dict:
        """Record true labels for served rows: items of {"id": <row id>, "label": <a class of the champion>}.
        All or nothing: raises FeedbackRefused naming item, field and rule (and writes nothing), FeedbackOff
        when no request log is kept, or NoChampion."""
        if self.settings.request_log is None:
            raise FeedbackOff("feedback needs the request log, and serve.request_log is empty (the log is off): "
                              "labels could not be joined to served rows")
        champion = self.router.champion
        if champion is None:
            raise NoChampion("no champion model is loaded yet, so there are no classes to check labels against")
        checked = validate_rows(label_model(tuple(champion.schema.classes)), items)
        problems = [{"item": p["row"], "field": "(item)" if p["field"] == "(row)" else p["field"], "rule": p["rule"],
                     "message": p["message"]} for p in checked]
        if problems:
            raise FeedbackRefused(problems)
        self.feedback_log.append("".join(feedback_line(item["id"], item["label"]) for item in items))
        return {"accepted": len(items)}
