"""The service's outermost ASGI layer: `POST /predict` is answered here, on the event loop, without FastAPI's
routing, dependency solving and JSON round trips (the model runs in microseconds: the rest of the request has
to as well); every other request goes on to the FastAPI app. Every answer carries an `x-request-id` header
(on /predict it is also the answer's `request_id`, the stem of its row ids).

Bodies are bounded, on every endpoint: a `content-length` over `max_body_bytes` is refused before it is read, a body
that grows past it while read is cut off; both get 413. A body is decoded on the event loop only while it is no
bigger than its model's decoder says is quick (`inline_body_bytes`: table rows up to a few dozen KiB; an image
never): the others are decoded in the thread pool, at most `serve.max_decodes` at once (the rest wait on the loop,
holding no thread), so a slow decode never holds up /health or another request. Large bodies (over BIG_BODY_BYTES)
are scored there too, so one big batch does not hold up the loop either.

`/feedback` takes the admin token, as the /admin endpoints do, when the service is bound to anything but loopback.

A request may carry a key (header `x-torchship-key`, e.g. a user or session id): the split is then sticky by it
(serving/variants.py sticky_bucket). During a canary's shadow the other variant scores the request after it is
answered (in the thread pool: a slow challenger in shadow does not hold up the loop)."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import uuid
from collections.abc import Awaitable, Callable

import orjson
from starlette.concurrency import run_in_threadpool

from serving.batching import MicroBatcher
from serving.service import Service
from serving.variants import NoChampion
from tasks.core.env import KEY_HEADER, TOKEN_ENV
from tasks.core.refusals import BodyRefused, RowsRefused

log = logging.getLogger("torchship.serving")
BIG_BODY_BYTES = 64 << 10   # a body this big is a batch: scored in the thread pool too, and never shadowed
JSON_HEADERS = [(b"content-type", b"application/json")]
KEY_HEADER_BYTES = KEY_HEADER.encode()   # ASGI header names are lower-case bytes
Send = Callable[[dict], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected before its body was read: nobody is left to answer."""


def new_request_id() -> str:
    return uuid.uuid4().hex


def token_refusal(authorization: str | None) -> tuple[int, str] | None:
    """Why a request is refused the admin endpoints: 403 while no admin token is configured, 401 unless
    `Authorization: Bearer <token>` matches it (compared in constant time); None when it matches."""
    expected = os.environ.get(TOKEN_ENV)
    if not expected:
        return 403, f"this endpoint is disabled: start the service with {TOKEN_ENV} set"
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not given or not secrets.compare_digest(given.encode(), expected.encode()):
        return 401, "this endpoint needs 'Authorization: Bearer <token>'"
    return None


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:   # a host name: it may resolve to anything
        return False


async def respond(send: Send, status: int, body: bytes, request_id: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode()),
                            (b"x-request-id", request_id.encode())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(scope: dict, receive, limit: int) -> bytes:
    """The whole request body, or BodyTooLarge as soon as it is known to exceed `limit` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise BodyTooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Front:
    """ASGI: /predict here, the rest to `app` (lifespan included); an `x-request-id` on every answer."""

    def __init__(self, app, service: Service, max_body_bytes: int, batcher: MicroBatcher | None = None,
                 max_decodes: int = 4, guard_feedback: bool = False):
        self.app = app
        self.state = app.state   # what tests and tools reach through the outermost app
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.batcher = batcher
        self.decodes = asyncio.Semaphore(max_decodes)
        self.guard_feedback = guard_feedback   # bound beyond loopback: /feedback needs the admin token

    async def __call__(self, scope: dict, receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"] == "/predict" and scope["method"] == "POST":
            await self.predict(scope, receive, send)
        else:
            await self.bounded(scope, receive, send)

    async def bounded(self, scope: dict, receive, send: Send) -> None:
        """Any other request, its body read here under the same limit as /predict's (and /feedback's token checked
        first, when it needs one), then handed to the app."""
        request_id = new_request_id()
        if self.guard_feedback and scope["path"] == "/feedback":
            authorization = next((value.decode("latin-1") for name, value in scope["headers"]
                                  if name == b"authorization"), None)
            refusal = token_refusal(authorization)
            if refusal is not None:
                return await self.refuse(send, *refusal, request_id)
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
        except BodyTooLarge:
            return await self.refuse(send, 413, self.too_large(), request_id)
        except ClientGone:
            return
        await self.app(scope, _replay(body, receive), self._with_request_id(send, request_id.encode()))

    def too_large(self) -> str:
        return (f"body over serve.max_body_mb ({self.max_body_bytes:,} bytes): the first limit any request meets, "
                "before an image's own images.max_file_mb (a file takes 4/3 of its size as base64); raise "
                "serve.max_body_mb to send more")

    async def off_loop(self, work: Callable, *args):
        """`work(*args)` in the thread pool, once fewer than serve.max_decodes run there (a waiting request holds no
        thread, only its body)."""
        async with self.decodes:
            return await run_in_threadpool(work, *args)

    @staticmethod
    def _with_request_id(send: Send, request_id: bytes) -> Send:
        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id)]
            await send(message)

        return send_with_id

    async def predict(self, scope: dict, receive, send: Send) -> None:
        request_id = new_request_id()
        key = next((value for name, value in scope["headers"] if name == KEY_HEADER_BYTES), None)
        content_type = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"content-type"),
                            None)
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
            variant = self.service.router.pick(key)
            if len(body) > BIG_BODY_BYTES:
                answer = await self.off_loop(self.service.predict, body, request_id, key, content_type, variant)
                accepted = None   # a big batch is not shadowed: a canary's figures come from everyday requests
            else:
                accepted = (self.service.accept(body, key, content_type, variant)
                            if len(body) <= variant.decoder.inline_body_bytes
                            else await self.off_loop(self.service.accept, body, key, content_type, variant))
                try:
                    probabilities = (await self.batcher.score(accepted.variant, accepted.rows) if self.batcher
                                     else accepted.variant.score(accepted.rows))
                except Exception:
                    self.service.failed(accepted)
                    raise
                answer = self.service.answer(accepted, probabilities, request_id)
        except RowsRefused as exc:
            return await self.refuse(send, 422, exc.problems, request_id)
        except BodyRefused as exc:
            return await self.refuse(send, exc.status, exc.detail, request_id)
        except BodyTooLarge:
            self.service.metrics.counter("-", "-", "too-large").inc()
            return await self.refuse(send, 413, self.too_large(), request_id)
        except NoChampion as exc:
            self.service.metrics.counter("-", "-", "unavailable").inc()
            return await self.refuse(send, 503, str(exc), request_id)
        except ClientGone:
            return
        except Exception:   # a bug, not the client's fault: say so, with the id to find it in the log
            log.exception("request %s failed", request_id)
            self.service.metrics.counter("-", "-", "error").inc()
            return await self.refuse(send, 500, "internal error", request_id)
        await respond(send, 200, answer, request_id)
        if accepted is not None and self.service.shadowing(accepted):
            await self.off_loop(self.service.score_shadow, accepted, request_id)

    @staticmethod
    async def refuse(send: Send, status: int, detail, request_id: str) -> None:
        await respond(send, status, orjson.dumps({"detail": detail, "request_id": request_id}), request_id)


def _replay(body: bytes, receive):
    """An ASGI `receive` that gives the body already read, then whatever the client sends next (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict:
        return pending.pop() if pending else await receive()

    return replayed
