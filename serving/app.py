"""The HTTP face of the service: /predict routes each request to the champion or (for a share) the
challenger and names each served row by an id, /feedback takes true labels for those ids, /health and
/metrics report, and token-guarded /admin endpoints reload or re-split traffic. The alias poller and the
buffered logs run for the app's lifespan."""
from __future__ import annotations

import os
import secrets
from contextlib import asynccontextmanager
from typing import Annotated, Any, AsyncIterator

from fastapi import APIRouter, Body, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from serving.service import FeedbackOff, RowsRefused, Service, ServiceSettings
from serving.variants import NoChampion

TOKEN_ENV = "TORCHSHIP_ADMIN_TOKEN"
ROWS_SHAPE = "body must be {\"rows\": [{feature: value, ...}, ...]} with at least one row"
LABELS_SHAPE = ("body must be {\"labels\": [{\"id\": <prediction id from /predict>, \"label\": <class>}, ...]} "
                "with at least one label")


async def current_service(request: Request) -> Service:
    return request.app.state.service


def require_admin(authorization: Annotated[str | None, Header()] = None) -> None:
    """403 while no admin token is configured, 401 unless `Authorization: Bearer <token>` matches it."""
    expected = os.environ.get(TOKEN_ENV)
    if not expected:
        raise HTTPException(403, f"admin endpoints are disabled: start the service with {TOKEN_ENV} set")
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not given or not secrets.compare_digest(given.encode(), expected.encode()):  # constant time
        raise HTTPException(401, "admin endpoints need 'Authorization: Bearer <token>'")


ServiceDep = Annotated[Service, Depends(current_service)]
routes = APIRouter()
admin = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


@routes.get("/health")
def health(service: ServiceDep) -> dict:
    return service.health()


@routes.post("/predict")
def predict(service: ServiceDep, body: Annotated[Any, Body()]) -> JSONResponse:
    # A plain `def`: FastAPI runs it in its thread pool, so inference never blocks /health or /metrics.
    rows = body.get("rows") if isinstance(body, dict) else None
    if not isinstance(rows, list) or not rows:
        raise HTTPException(422, ROWS_SHAPE)
    return JSONResponse(service.predict(rows))


@routes.post("/feedback")
def feedback(service: ServiceDep, body: Annotated[Any, Body()]) -> dict:
    """True labels for served rows, joined by the monitor on the prediction ids: all accepted or none."""
    labels = body.get("labels") if isinstance(body, dict) else None
    if not isinstance(labels, list) or not labels:
        raise HTTPException(422, LABELS_SHAPE)
    return service.feedback(labels)


@routes.get("/metrics")
def metrics(service: ServiceDep) -> Response:
    return Response(service.metrics.exposition(), media_type=service.metrics.content_type)


@admin.post("/reload")
def reload(service: ServiceDep) -> dict:
    """Follow the aliases now instead of at the next poll."""
    service.refresh()
    return service.health()


@admin.post("/share")
def set_share(service: ServiceDep, share: Annotated[float, Query(ge=0.0, le=1.0)]) -> dict:
    """Route this share of traffic to the challenger from now on."""
    service.set_share(share)
    return service.health()


async def rows_refused(request: Request, exc: RowsRefused) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": exc.problems})


async def feedback_off(request: Request, exc: FeedbackOff) -> JSONResponse:
    return JSONResponse(status_code=409, content={"detail": str(exc)})


async def no_champion(request: Request, exc: NoChampion) -> JSONResponse:
    return JSONResponse(status_code=503, content={"detail": str(exc)})


def create_app(settings: ServiceSettings, client=None) -> FastAPI:
    """The app over one Service; nothing is opened until the app starts (its lifespan)."""
    service = Service(settings, client)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)  # blocking registry I/O: off the event loop
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    served = f"model file {settings.model_file}" if settings.model_file else f"registered model '{settings.model_name}'"
    app = FastAPI(title="torchship", description=f"Serves {served}.", lifespan=lifespan)
    app.state.service = service
    app.include_router(routes)
    app.include_router(admin)
    app.add_exception_handler(RowsRefused, rows_refused)
    app.add_exception_handler(FeedbackOff, feedback_off)
    app.add_exception_handler(NoChampion, no_champion)
    return app
