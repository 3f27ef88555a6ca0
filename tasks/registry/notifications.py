"""Notifications: a JSON POST to a webhook (its URL from TORCHSHIP_WEBHOOK_URL) once per change of state, whoever
observes it and however often (the monitor, status, a pipeline: several may see one state).

Once: each notice has a key naming the state it reports (`approval-waiting` of v7, `retrain-fired` at a decision's
time). Before sending, the observer claims the key as a tag of the registered model (`notified.<event>.<key>`),
under the registry lock beside the alias history: the store every machine shares. A claim found means another
observer sent it (or is sending it). Every attempt failed: the claim is taken back, so the next observer of the same
state sends it. The body's `text` is what Slack and Teams incoming webhooks show."""
from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable

from pydantic import BaseModel

from tasks.core.env import WEBHOOK_URL_ENV
from tasks.core.params_spec import NotifyEvent, NotifyParams
from tasks.registry.history import now
from tasks.registry.lock import alias_lock
from tasks.registry.read import store_busy

log = logging.getLogger("torchship.notify")
PREFIX = "notified."
RETRIED_STATUS = {408, 429}      # and every 5xx: the receiver may answer later


class Notice(BaseModel):
    event: NotifyEvent
    key: str                  # the state it reports: one notice per (event, key)
    model: str
    text: str

    def tag(self) -> str:
        """The registered model's tag that claims this notice (MLflow tag keys: word characters, `.`, `-`)."""
        return f"{PREFIX}{self.event}.{re.sub(r'[^A-Za-z0-9_.-]', '_', self.key)[:200]}"

    def body(self) -> dict:
        return {"event": self.event, "key": self.key, "model": self.model, "text": self.text, "time": now()}


def retried(status: int | None) -> bool:
    """Whether an answer (None: no answer at all) is worth another attempt."""
    return status is None or status >= 500 or status in RETRIED_STATUS


def post_webhook(url: str, body: dict, rules: NotifyParams, sleep: Callable[[float], None] = time.sleep
                 ) -> tuple[bool, str]:
    """POST `body` as JSON with bounded retries (1 + rules.retries attempts, backoff doubling from
    rules.retry_delay_s); returns (delivered, what happened in words). Never raises."""
    import httpx

    delay, said = rules.retry_delay_s, ""
    for attempt in range(1, rules.retries + 2):
        try:
            answer = httpx.post(url, content=json.dumps(body), timeout=rules.timeout_s,
                                headers={"content-type": "application/json"})
            status, said = answer.status_code, f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            status, said = None, f"{type(exc).__name__}: {exc}"
        if status is not None and 200 <= status < 300:
            return True, f"{said} after {attempt} attempt(s)"
        if not retried(status) or attempt > rules.retries:
            break
        sleep(delay)
        delay *= 2
    return False, f"{said} after {attempt} attempt(s)"


def notify_once(client, notice: Notice, rules: NotifyParams, environ: dict[str, str] | None = None) -> str:
    """Send `notice` unless it is switched off, no webhook is set, or an observer claimed it already; returns what
    happened in words (`sent`, `claimed already`, ...). A failure is logged, never raised: a notice must not stop
    the work that observed the state. Call it outside `alias_lock` (it takes the lock itself)."""
    url = (os.environ if environ is None else environ).get(WEBHOOK_URL_ENV, "")
    if notice.event not in rules.events:
        return "off (notify.events)"
    if not url:
        return f"off ({WEBHOOK_URL_ENV} not set)"
    try:
        if not claim(client, notice):
            return "claimed already"
        delivered, said = post_webhook(url, notice.body(), rules)
        if not delivered:
            client.delete_registered_model_tag(notice.model, notice.tag())   # the next observer sends it again
            log.warning("notice %s %s not delivered (%s): the next observer retries", notice.event, notice.key, said)
            return f"not delivered: {said}"
        return f"sent: {said}"
    except Exception as exc:   # the registry unreachable or busy: the next observer sees the same state
        if not store_busy(exc):
            log.warning("notice %s %s not sent: %s", notice.event, notice.key, exc)
        return f"not sent: {exc}"


def claim(client, notice: Notice) -> bool:
    """Claim the notice for this observer under the registry lock; False when another observer claimed it."""
    with alias_lock(client, notice.model):
        if notice.tag() in client.get_registered_model(notice.model).tags:
            return False
        client.set_registered_model_tag(notice.model, notice.tag(), f"{now()} {notice.text}"[:4000])
        return True


def champion_notice(model: str, version: str, concern: str) -> Notice:
    """An unblessed or rejected champion serves (a person moved it there): once per version made champion so."""
    return Notice(event="champion-unblessed", key=f"v{version}", model=model,
                  text=f"{model}: champion v{version} serves although {concern}")


def approval_notice(model: str, version: str, deadline: float) -> Notice:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(deadline))
    return Notice(event="approval-waiting", key=f"v{version}", model=model,
                  text=f"{model}: v{version} awaits approval until {when}: torchship approve|reject {version} "
                       "--reason ..., or tag approval=approved:NAME in the MLflow UI")
