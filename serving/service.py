"""The service's state and behaviour without HTTP: the registry client, the router over the live variants,
metrics, the request log, and the alias poller that hot-swaps a variant when its alias moves."""
from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, create_model

from serving.metrics import Metrics
from serving.request_log import RequestLog
from serving.validation import row_model, validate_rows
from serving.variants import NoChampion, Router, Variant, load_variant
from tasks.config import ServeParams, TrackingParams
from tasks.contract import schema_from_metadata
from tasks.core.registry import CHALLENGER, CHAMPION, alias_version, registry_client
from tasks.core.runtime import open_onnx
from tasks.core.servelog import feedback_line, feedback_path, row_id, served_line

log = logging.getLogger("torchship.serving")
STOP_TIMEOUT_S = 10.0   # how long shutdown waits for a poll that is downloading a version
PROBABILITY_DIGITS = 6  # in the request log: the monitor needs no more, and full float reprs lengthen every line


@dataclass(frozen=True)
class ServiceSettings:
    """What a service runs with: the `serve` params section (CLI flags already applied), the model and the
    registry it serves, and the two run-time options that are not params."""

    serve: ServeParams
    model_name: str
    tracking: TrackingParams
    seed: int | None = None   # of the traffic split: a canary replays reproducibly
    shadow: bool = False      # also score each request with the other variant (canary analysis on paired rows)
    model_file: Path | None = None   # serve this ONNX file as the champion: no registry, poller or logs (bless)

    @property
    def request_log(self) -> Path | None:
        """Where served rows go; an empty `serve.request_log` (or a model file) turns the log off."""
        return Path(self.serve.request_log) if self.serve.request_log and self.model_file is None else None

    def open_log(self, path: Path | None) -> RequestLog:
        """A buffered, rotated log on `path` with the `serve.log_*` settings."""
        return RequestLog(path, flush_seconds=self.serve.log_flush_seconds,
                          rotate_bytes=int(self.serve.log_rotate_mb * (1 << 20)),
                          rotate_seconds=self.serve.log_rotate_hours * 3600.0)


def file_variant(path: Path, threads: int) -> Variant:
    """A local ONNX file (exported by torchship: it carries its schema) as the champion, version `file`."""
    session = open_onnx(path, threads)
    schema = schema_from_metadata(session.get_modelmeta().custom_metadata_map)
    log.info("serving %s", path)
    return Variant(alias=CHAMPION, version="file", schema=schema, session=session, row_type=row_model(schema))


class RowsRefused(ValueError):
    """Request rows that break the model's schema; `problems` name row, field and rule."""

    def __init__(self, problems: list[dict]):
        super().__init__(f"{len(problems)} problem(s) in the request rows")
        self.problems = problems


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
    """Champion and challenger behind one router, kept in step with the registry's aliases.

    Building one touches nothing; `start()` opens the request and feedback logs, loads the aliased versions
    and starts the poller; `stop()` undoes that (and writes what the logs still buffer)."""

    def __init__(self, settings: ServiceSettings, client=None):
        self.settings = settings
        self.client = client   # made in start() unless given: opening an MLflow store is I/O
        self.router = Router(share=settings.serve.challenger_share, rng=random.Random(settings.seed))
        self.metrics = Metrics()
        self.request_log = settings.open_log(settings.request_log)
        self.feedback_log = settings.open_log(feedback_path(settings.request_log) if settings.request_log else None)
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def start(self) -> None:
        if self.settings.model_file is not None:   # a file, not the registry: nothing to poll, nothing to log
            self.router.champion = file_variant(self.settings.model_file, self.settings.serve.threads)
            return
        if self.client is None:
            self.client = registry_client(self.settings.tracking)
        self.request_log.open()
        self.feedback_log.open()
        self._refresh_or_log()
        self._stop.clear()
        self._poller = threading.Thread(target=self._poll, name="alias-poller", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(STOP_TIMEOUT_S)
            self._poller = None
        self.request_log.close()
        self.feedback_log.close()

    def refresh(self) -> None:
        """Load whatever the aliases point at now; a new version that fails to load is logged and the
        current one keeps serving. A service on a model file has no aliases to follow."""
        if self.settings.model_file is not None:
            return
        for alias in (CHAMPION, CHALLENGER):
            self._follow(alias)

    def _follow(self, alias: str) -> None:
        current: Variant | None = getattr(self.router, alias)
        moved = alias_version(self.client, self.settings.model_name, alias)
        if moved is None:
            if alias == CHALLENGER:  # the canary ended (promoted or rolled back): all traffic to the champion
                self.router.challenger = None
            return
        if current is not None and current.version == str(moved.version):
            return
        try:
            variant = load_variant(self.client, self.settings.model_name, alias, str(moved.version),
                                   self.settings.serve.threads)
        except Exception as exc:  # a broken new version must not take the service down
            log.error("could not load %s v%s, keeping the current one: %s", alias, moved.version, exc)
            return
        setattr(self.router, alias, variant)
        self.metrics.version.labels(alias).set(int(variant.version))
        self.metrics.reloads.labels(alias).inc()

    def _refresh_or_log(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # the registry may be briefly unreachable: the next poll retries
            log.error("alias poll failed, retrying in %ss: %s", self.settings.serve.poll_seconds, exc)

    def _poll(self) -> None:
        while not self._stop.wait(self.settings.serve.poll_seconds):
            self._refresh_or_log()

    def set_share(self, share: float) -> None:
        self.router.share = share

    def health(self) -> dict:
        champion, challenger = self.router.champion, self.router.challenger
        return {"status": "ok" if champion else "no-model", "model": self.settings.model_name,
                "champion": champion.version if champion else None,
                "challenger": challenger.version if challenger else None, "challenger_share": self.router.share}

    def predict(self, rows: list[dict]) -> dict:
        """Score rows with the variant the router picks (and, with `shadow`, the other one too); each row
        gets an id (`<request_id>-<index>`) that feedback names. Raises RowsRefused naming row, field and
        rule, or NoChampion."""
        started = time.perf_counter()
        variant = self.router.pick()
        problems = validate_rows(variant.row_type, rows)
        if problems:
            self.metrics.requests.labels(variant.alias, variant.version, "invalid").inc()
            raise RowsRefused(problems)
        frame = pd.DataFrame(rows)
        labels, probabilities = variant.predict(frame)
        self.metrics.latency.labels(variant.alias).observe(time.perf_counter() - started)
        self.metrics.requests.labels(variant.alias, variant.version, "ok").inc()
        request_id, classes = uuid.uuid4().hex, variant.schema.classes
        answer = {"request_id": request_id, "variant": variant.alias, "version": variant.version,
                  "served_ms": (time.perf_counter() - started) * 1e3, "predictions": [
                      {"id": row_id(request_id, i), "label": label, "probabilities": dict(zip(classes, map(float, p)))}
                      for i, (label, p) in enumerate(zip(labels, probabilities))]}
        self._log_served(request_id, variant, rows, labels, probabilities)
        if self.settings.shadow:  # after served_ms and the latency metric: they measure the answering variant
            self._score_shadow(answer, variant, frame)
        return answer

    def _log_served(self, request_id: str, variant: Variant, rows: list[dict], labels: list[str],
                    probabilities) -> None:
        """One line per row, buffered: the request does not wait on the disk."""
        classes = variant.schema.classes
        self.request_log.append("".join(
            served_line(request_id, i, variant.alias, variant.version, row, label,
                        {name: round(float(value), PROBABILITY_DIGITS) for name, value in zip(classes, p)})
            for i, (row, label, p) in enumerate(zip(rows, labels, probabilities))))

    def _score_shadow(self, answer: dict, variant: Variant, frame: pd.DataFrame) -> None:
        shadow = self.router.other(variant)
        if shadow is None:
            return
        try:
            answer["shadow"] = {"variant": shadow.alias, "version": shadow.version, "labels": shadow.predict(frame)[0]}
        except Exception as exc:  # a failing shadow must never fail the answer
            self.metrics.requests.labels(shadow.alias, shadow.version, "shadow-error").inc()
            log.error("shadow %s v%s failed: %s", shadow.alias, shadow.version, exc)

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
