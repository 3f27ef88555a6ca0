"""The FastAPI service: routes each request to the champion or (for a share) the challenger,
follows alias moves in the registry without dropping a request, logs requests, exposes /metrics."""
from __future__ import annotations

import json
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
from fastapi import Body, FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from serving.variants import Variant, load_variant
from tasks.contract import Schema

log = logging.getLogger("torchship.serving")
TOKEN_ENV = "TORCHSHIP_ADMIN_TOKEN"


@dataclass
class ServiceSettings:
    model_name: str
    challenger_share: float = 0.0
    poll_seconds: float = 5.0
    request_log: Path | None = None
    seed: int | None = None
    shadow: bool = False   # also score each request with the other variant (canary analysis on paired rows)


@dataclass
class Router:
    """Holds the live variants; swapping a reference is atomic, so requests never see a half-loaded model."""

    champion: Variant | None = None
    challenger: Variant | None = None
    share: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def pick(self) -> Variant:
        if self.challenger is not None and self.rng.random() < self.share:
            return self.challenger
        if self.champion is None:
            raise HTTPException(503, "no champion model is loaded yet: register one (torchship run) and retry")
        return self.champion

    def other(self, variant: Variant) -> Variant | None:
        """The variant not answering this request (for shadow scoring), if both are loaded."""
        if self.challenger is None or self.champion is None:
            return None
        return self.challenger if variant is self.champion else self.champion


def row_model(schema: Schema) -> type[BaseModel]:
    """The request row type, generated from the model's schema (and so from the data contract it was
    trained under): every feature present, typed, in range, in its category set, null only if allowed."""
    fields: dict[str, Any] = {}
    for i, feature in enumerate(schema.features):
        if feature.kind == "numeric":
            kind: Any = Annotated[float, Field(ge=feature.min, le=feature.max, allow_inf_nan=False)]
        elif feature.closed_categories:
            kind = Literal[tuple(feature.categories)]
        else:
            kind = str | int
        fields[f"f{i}"] = (kind | None if feature.nullable else kind, Field(..., alias=feature.name))
    return create_model("Row", __config__=ConfigDict(extra="forbid", strict=True), **fields)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("torchship_requests", "Prediction requests", ["variant", "version", "status"],
                                registry=self.registry)
        self.latency = Histogram("torchship_request_seconds", "Prediction latency", ["variant"], registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.version = Gauge("torchship_model_version", "Version behind each alias", ["alias"], registry=self.registry)
        self.reloads = Counter("torchship_model_reloads", "Alias moves picked up", ["alias"], registry=self.registry)


class RequestLog:
    """Served rows and predictions as JSON lines, the input of the drift monitor."""

    def __init__(self, path: Path | None):
        self.lock = threading.Lock()
        self.handle = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = path.open("a", encoding="utf-8")

    def close(self) -> None:
        with self.lock:
            if self.handle is not None:
                self.handle.close()
                self.handle = None

    def write(self, variant: Variant, rows: list[dict], labels: list[str]) -> None:
        if self.handle is None:
            return
        stamp = time.time()
        lines = "".join(json.dumps({"ts": stamp, "alias": variant.alias, "version": variant.version,
                                    "features": row, "prediction": label}) + "\n" for row, label in zip(rows, labels))
        with self.lock:
            self.handle.write(lines)
            self.handle.flush()


def create_app(settings: ServiceSettings, client=None) -> FastAPI:
    """Build the app; the registry client is made here (entry point), never at import."""
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    router = Router(share=settings.challenger_share, rng=random.Random(settings.seed))
    metrics = Metrics()
    request_log = RequestLog(settings.request_log)
    row_types: dict[str, type[BaseModel]] = {}
    stop = threading.Event()

    def refresh() -> None:
        """Load whatever the aliases point at now; keep serving the old variant if loading fails."""
        for alias in ("champion", "challenger"):
            current: Variant | None = getattr(router, alias)
            try:
                version = client.get_model_version_by_alias(settings.model_name, alias).version
            except Exception:
                version = None
            if version is None:
                if alias == "challenger" and current is not None:
                    router.challenger = None
                continue
            if current is not None and current.version == str(version):
                continue
            try:
                variant = load_variant(client, settings.model_name, alias)
            except Exception as exc:  # a broken new version must not take the service down
                log.error("could not load %s v%s, keeping the current one: %s", alias, version, exc)
                continue
            if variant is None:  # the alias moved away between the two look-ups: next poll
                continue
            row_types[variant.version] = row_model(variant.schema)
            setattr(router, alias, variant)
            metrics.version.labels(alias).set(int(variant.version))
            metrics.reloads.labels(alias).inc()

    def poll() -> None:
        while not stop.wait(settings.poll_seconds):
            try:
                refresh()
            except Exception as exc:  # the registry may be briefly unreachable: keep polling
                log.error("alias poll failed, retrying in %ss: %s", settings.poll_seconds, exc)

    refresh()
    app = FastAPI(title="torchship", description=f"Serves registered model '{settings.model_name}'.")
    app.state.router, app.state.refresh = router, refresh
    poller = threading.Thread(target=poll, name="alias-poller", daemon=True)

    @app.on_event("startup")
    def start_polling() -> None:
        poller.start()

    @app.on_event("shutdown")
    def stop_polling() -> None:
        stop.set()
        request_log.close()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok" if router.champion else "no-model", "model": settings.model_name,
                "champion": router.champion.version if router.champion else None,
                "challenger": router.challenger.version if router.challenger else None,
                "challenger_share": router.share}

    @app.post("/predict")
    def predict(body: Any = Body(...)) -> JSONResponse:
        # A plain `def`: FastAPI runs it in its thread pool, so inference never blocks /health or /metrics.
        started = time.perf_counter()
        variant = router.pick()
        rows = body.get("rows") if isinstance(body, dict) else None
        if not isinstance(rows, list) or not rows:
            raise HTTPException(422, "body must be {\"rows\": [{feature: value, ...}, ...]} with at least one row")
        problems = _validate_rows(row_types[variant.version], rows)
        if problems:
            metrics.requests.labels(variant.alias, variant.version, "invalid").inc()
            return JSONResponse(status_code=422, content={"detail": problems})
        frame = pd.DataFrame(rows)
        labels, probabilities = variant.predict(frame)
        metrics.latency.labels(variant.alias).observe(time.perf_counter() - started)
        request_log.write(variant, rows, labels)
        metrics.requests.labels(variant.alias, variant.version, "ok").inc()
        answer = {"variant": variant.alias, "version": variant.version,
                  "served_ms": (time.perf_counter() - started) * 1e3, "predictions": [
            {"label": label, "probabilities": dict(zip(variant.schema.classes, map(float, p)))}
            for label, p in zip(labels, probabilities)]}
        shadow = router.other(variant) if settings.shadow else None
        if shadow is not None:  # after served_ms and the latency metric: they measure the answering variant only
            try:
                answer["shadow"] = {"variant": shadow.alias, "version": shadow.version,
                                    "labels": shadow.predict(frame)[0]}
            except Exception as exc:  # a failing shadow must never fail the answer
                metrics.requests.labels(shadow.alias, shadow.version, "shadow-error").inc()
                log.error("shadow %s v%s failed: %s", shadow.alias, shadow.version, exc)
        return JSONResponse(answer)

    @app.get("/metrics")
    def prometheus() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/reload")
    def reload(authorization: str | None = Header(None)) -> dict:
        _check_token(authorization)
        refresh()
        return health()

    @app.post("/admin/share")
    def set_share(share: float, authorization: str | None = Header(None)) -> dict:
        _check_token(authorization)
        if not 0.0 <= share <= 1.0:
            raise HTTPException(422, "share must be between 0 and 1")
        router.share = share
        return health()

    return app


def _validate_rows(row_type: type[BaseModel], rows: list) -> list[dict]:
    """422 details naming row, field and rule."""
    problems = []
    for index, row in enumerate(rows):
        try:
            row_type.model_validate(row)
        except ValidationError as exc:
            seen = set()
            for error in exc.errors():
                column = str(error["loc"][0]) if error["loc"] else "(row)"
                if column in seen:  # a union type reports once per member: one line per column is enough
                    continue
                seen.add(column)
                problems.append({"row": index, "field": column, "rule": error["type"], "message": error["msg"]})
    return problems


def _check_token(authorization: str | None) -> None:
    expected = os.environ.get(TOKEN_ENV)
    if not expected:
        raise HTTPException(403, f"admin endpoints are disabled: start the service with {TOKEN_ENV} set")
    if not authorization or not secrets.compare_digest(authorization.removeprefix("Bearer ").strip(), expected):
        raise HTTPException(401, "admin endpoints need 'Authorization: Bearer <token>'")
