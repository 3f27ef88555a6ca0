"""The HTTP face of the service: /predict routes each request to the champion or (for a share) the
challenger and names each served row by an id (answered by serving/front.py, in front of this FastAPI app),
/feedback takes true labels for those ids, /health (the process is up), /ready (a champion is loaded and
warmed) and /metrics report, and token-guarded /admin endpoints reload or re-split traffic (/feedback takes the
same token when the service is bound beyond loopback: serving/front.py). The alias poller and the buffered logs run
for the app's lifespan."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from serving.batching import MicroBatcher
from serving.front import Front, is_loopback, new_request_id, token_refusal
from serving.openapi import contract_openapi
from serving.service import FeedbackOff, Service, ServiceSettings
from serving.variants import NoChampion
from tasks.core.refusals import BodyRefused, RowsRefused

LABELS_SHAPE = ("body must be {\"labels\": [{\"id\": <prediction id from /predict>, \"label\": <class>}, ...]} "
                "with at least one label")


async def current_service(request: Request) -> Service:
    return request.app.state.service


def require_admin(authorization: Annotated[str | None, Header()] = None) -> None:
    """403 while no admin token is configured, 401 unless `Authorization: Bearer <token>` matches it."""
    refusal = token_refusal(authorization)
    if refusal is not None:
        raise HTTPException(*refusal)


ServiceDep = Annotated[Service, Depends(current_service)]
routes = APIRouter()
admin = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


@routes.get("/health")
async def health(service: ServiceDep) -> dict:
    """The process is up (200 even before a model is loaded; `status` says whether one is)."""
    return service.health()


@routes.get("/ready")
async def ready(service: ServiceDep) -> JSONResponse:
    """200 once a champion is loaded and warmed, 503 until then: what a balancer should route on."""
    return JSONResponse(service.health(), status_code=200 if service.ready() else 503)


@routes.post("/predict", include_in_schema=False)
async def predict(service: ServiceDep, request: Request) -> Response:
    """Reached only when this app is served without its Front (which answers /predict itself)."""
    return Response(service.predict(await request.body(), new_request_id(), None, request.headers.get("content-type")),
                    media_type="application/json")


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
    """Follow the aliases now instead of at the next poll (and retry a version that failed to load)."""
    service.refresh(retry_refused=True)
    return service.health()


@admin.post("/share")
def set_share(service: ServiceDep, share: Annotated[float, Query(ge=0.0, le=1.0)],
              shadow: Annotated[bool | None, Query()] = None) -> dict:
    """Route this share of traffic to the challenger from now on; `shadow`: whether the variant that does not
    answer also scores each request (logged to shadow.jsonl beside the request log, never returned)."""
    service.set_share(share, shadow)
    return service.health()


async def rows_refused(request: Request, exc: RowsRefused) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": exc.problems})


async def body_refused(request: Request, exc: BodyRefused) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content={"detail": exc.detail})


async def feedback_off(request: Request, exc: FeedbackOff) -> JSONResponse:
    return JSONResponse(status_code=409, content={"detail": str(exc)})


async def no_champion(request: Request, exc: NoChampion) -> JSONResponse:
    return JSONResponse(status_code=503, content={"detail": str(exc)})


def create_app(settings: ServiceSettings) -> Front:
    """The app over one Service (/predict in front, the rest in FastAPI); nothing is opened until the app starts
    (its lifespan)."""
    service = Service(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)  # waits for the registry: off the event loop
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
    app.add_exception_handler(BodyRefused, body_refused)
    app.add_exception_handler(FeedbackOff, feedback_off)
    app.add_exception_handler(NoChampion, no_champion)
    app.openapi = contract_openapi(app, lambda: service.router.champion)
    serve = settings.serve
    batcher = MicroBatcher(serve.batch_max_rows, serve.batch_wait_ms / 1e3) if serve.batch else None
    return Front(app, service, max_body_bytes=int(serve.max_body_mb * (1 << 20)), batcher=batcher,
                 max_decodes=serve.max_decodes, guard_feedback=not is_loopback(serve.host))
