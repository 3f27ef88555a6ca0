"""The approval step on the registry (promotion.approval: required): register asks, a person decides
(`torchship approve|reject`, or the version's `approval` tag in the MLflow UI), and the next pipeline, monitor or
status that sees an open decision acts on it: an approved version takes `challenger` (its canary decides next), a
rejected or timed-out one is tagged rejected and the champion is untouched. Each decision, with the person, is an
entry of the alias history, written under the registry lock with any move it makes.

Why no alias while a version waits: the alias is what a running service (serve.challenger_share), `torchship
canary` and the canary deployment act on; a version no person approved must reach no traffic, not even a
shadow copy. The approved version takes `challenger` then, recorded as the approver's move.

The rules, pure: where a version stands, read from its tags (promotion.approval: required).

A version that awaits approval carries `approval_requested` (when register asked, epoch seconds) and `approval`:
`waiting`, until a person writes `approved:<name>` or `rejected:<name>` (in the MLflow UI, or through
`torchship approve|reject`). The observer that acts on it adds `approval_decided`, after which nothing reads the
version again. Tag values are what a person types in a form: case and spaces around the name do not matter."""
from __future__ import annotations

import logging
import time
from enum import StrEnum

from pydantic import BaseModel

from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params
from tasks.registry.history import record_decision
from tasks.registry.notifications import approval_notice, notify_once
from tasks.registry.read import CHALLENGER, CHAMPION, alias_version, model_version, registry_client
from tasks.registry.write import recorded_move, reject

APPROVAL_TAG = "approval"                   # waiting | approved:<name> | rejected:<name> | timed out
REQUESTED_TAG = "approval_requested"        # epoch seconds when register asked
DECIDED_TAG = "approval_decided"            # what was done and by whom: the version is settled
WAITING = "waiting"
TIMED_OUT = "timed out"
UNNAMED = "an unnamed approver"             # `approved` with no name after it: MLflow records no author of a tag


class ApprovalState(StrEnum):
    NOT_ASKED = "not asked"      # registered without the approval step
    WAITING = "waiting"          # asked, nobody decided, within the timeout
    APPROVED = "approved"        # a person approved; to act on (challenger, then the canary)
    REJECTED = "rejected"        # a person rejected; to act on (tag rejected, champion untouched)
    TIMED_OUT = "timed out"      # nobody decided within promotion.approval_timeout_s; to act on as a rejection
    SETTLED = "settled"          # acted on already: nothing more to do


class ApprovalView(BaseModel):
    """Where one version stands: its state, who decided (a person's name, when the tag gives one), the deadline."""

    state: ApprovalState
    approver: str = ""
    requested: float | None = None
    deadline: float | None = None

    def open(self) -> bool:
        """A decision that an observer must act on now."""
        return self.state in {ApprovalState.APPROVED, ApprovalState.REJECTED, ApprovalState.TIMED_OUT}


def parse_decision(value: str) -> tuple[str, str] | None:
    """("approved" | "rejected", name) from a tag value such as `approved:alice` or `Rejected: Bob`; None when the
    value is no decision (e.g. `waiting`, or a typo: it stays waiting, and times out, rather than guessing)."""
    word, _, name = value.strip().partition(":")
    word = word.strip().lower()
    if word not in {"approved", "rejected"}:
        return None
    return word, name.strip() or UNNAMED


def approval_view(tags: dict[str, str], now: float, timeout_s: float) -> ApprovalView:
    """The state machine: not asked -> waiting -> approved | rejected | timed out -> settled. A person's decision
    found in the tag is honoured even when it is noticed after the deadline (MLflow keeps no time of a tag write,
    so it may have been made in time); a version nobody decided by the deadline times out."""
    if REQUESTED_TAG not in tags:
        return ApprovalView(state=ApprovalState.NOT_ASKED)
    try:
        requested = float(tags[REQUESTED_TAG])
    except ValueError:     # edited by hand into something else: count from the epoch, i.e. already due
        requested = 0.0
    deadline = requested + timeout_s
    view = {"requested": requested, "deadline": deadline}
    if DECIDED_TAG in tags:
        return ApprovalView(state=ApprovalState.SETTLED, **view)
    decision = parse_decision(tags.get(APPROVAL_TAG, ""))
    if decision is not None:
        word, name = decision
        state = ApprovalState.APPROVED if word == "approved" else ApprovalState.REJECTED
        return ApprovalView(state=state, approver=name, **view)
    if now > deadline:
        return ApprovalView(state=ApprovalState.TIMED_OUT, **view)
    return ApprovalView(state=ApprovalState.WAITING, **view)


def request_tags(now: float | None = None) -> dict[str, str]:
    """The tags register sets on a version that must wait for a person."""
    return {APPROVAL_TAG: WAITING, REQUESTED_TAG: f"{time.time() if now is None else now:.0f}"}


log = logging.getLogger("torchship.approval")
KIND = "approval"


class ApprovalAction(BaseModel):
    """What one look at a version did: `outcome` approved | rejected | timed out | blocked | stale | settled."""

    version: str
    outcome: str
    approver: str = ""
    action: str                      # in words
    canary_due: bool = False         # it took `challenger`: its canary is next


class Waiting(BaseModel):
    version: str
    requested: float
    deadline: float


def request_approval(client, name: str, version: str, actor: str, evidence: str = "") -> str:
    """Leave `version` awaiting a person (tags, and a history entry); call it under the alias lock (and
    `announce_waiting` after it)."""
    for key, value in request_tags().items():
        client.set_model_version_tag(name, version, key, value)
    record_decision(client, name, KIND, actor, "awaiting approval: blessed; a person approves or rejects before any "
                    "traffic reaches it", version, evidence)
    return f"v{version} awaits approval: `torchship approve {version} --reason ...` starts its canary"


def announce_waiting(params: Params, client, name: str, version: str) -> str:
    """The webhook's `approval-waiting` notice for `version`, once."""
    deadline = time.time() + params.promotion.approval_timeout_s
    return notify_once(client, approval_notice(name, version, deadline), params.notify)


def why_blocked(client, name: str, version) -> tuple[str, str] | None:
    """("stale" | "blocked", why) when the approved version cannot take `challenger` now, else None: the champion
    is no longer the one bless judged it against (stale: for good), or another version holds `challenger`
    (blocked: until that canary ends)."""
    champion = alias_version(client, name, CHAMPION)
    judged = version.tags.get("parent_version")
    if champion is not None and judged is not None and str(champion.version) != judged:
        return "stale", (f"the champion is v{champion.version} now, not v{judged} that bless judged v{version.version} "
                         f"against: re-run `torchship run` to judge it again")
    challenger = alias_version(client, name, CHALLENGER)
    if challenger is not None and str(challenger.version) != str(version.version):
        return "blocked", (f"v{challenger.version} holds `challenger` (its canary runs, or was interrupted); "
                           f"v{version.version} takes it when that canary has ended")
    return None


def decide(client, name: str, version: str, word: str, approver: str, actor: str, reason: str,
           timeout_s: float) -> ApprovalAction:
    """Act on a decision about `version` (`word`: approved | rejected), under the registry lock with the history
    kept. A version still waiting past its deadline is timed out whatever `word` says (the deadline passed first)."""
    with recorded_move(client, name, actor) as move:
        found = model_version(client, name, version)
        view = approval_view(found.tags, time.time(), timeout_s)
        if view.state is ApprovalState.NOT_ASKED:
            raise TorchshipError(f"v{version} of {name} was not registered awaiting approval (promotion.approval "
                                 "was none then): nothing to approve or reject")
        if view.state is ApprovalState.SETTLED:
            return ApprovalAction(version=version, outcome="settled", action=f"v{version}: already decided "
                                  f"({found.tags[DECIDED_TAG]})")
        if view.state is ApprovalState.TIMED_OUT:
            word, approver = TIMED_OUT, ""
            reason = f"not approved within promotion.approval_timeout_s {timeout_s:g}"
        elif view.state in {ApprovalState.APPROVED, ApprovalState.REJECTED} and word != view.state.value:
            word, approver = view.state.value, view.approver    # the tag a person set wins over a later look
        if word == "approved":
            client.set_model_version_tag(name, version, APPROVAL_TAG, f"approved:{approver}")
            return _take_challenger(client, name, found, approver, actor, reason, move)
        client.set_model_version_tag(name, version, APPROVAL_TAG, f"rejected:{approver}" if approver else TIMED_OUT)
        reject(client, name, version, f"{word}{' by ' + approver if approver else ''}: {reason}")
        client.set_model_version_tag(name, version, DECIDED_TAG, f"{_stamp()} {word} by {actor}: {reason}"[:5000])
        record_decision(client, name, KIND, actor, f"{word}{' by ' + approver if approver else ''}: {reason}", version)
        return ApprovalAction(version=version, outcome=word, approver=approver,
                              action=f"v{version} {word}: tagged rejected; champion untouched")


def _take_challenger(client, name: str, found, approver: str, actor: str, reason: str, move) -> ApprovalAction:
    version = str(found.version)
    blocked = why_blocked(client, name, found)
    if blocked is not None and blocked[0] == "blocked":   # the decision stays in the tag; a later look acts on it
        return ApprovalAction(version=version, outcome="blocked", approver=approver,
                              action=f"v{version} approved by {approver}, not yet canaried: {blocked[1]}")
    if blocked is not None:
        client.set_model_version_tag(name, version, "stale", blocked[1])
        client.set_model_version_tag(name, version, DECIDED_TAG, f"{_stamp()} approved by {actor}, stale: "
                                     f"{blocked[1]}"[:5000])
        record_decision(client, name, KIND, actor, f"approved by {approver}: {reason}; not canaried: {blocked[1]}",
                        version)
        return ApprovalAction(version=version, outcome="stale", approver=approver,
                              action=f"v{version} approved but not canaried: {blocked[1]}")
    record_decision(client, name, KIND, actor, f"approved by {approver}: {reason}", version)
    client.set_registered_model_alias(name, CHALLENGER, version)
    client.set_model_version_tag(name, version, DECIDED_TAG, f"{_stamp()} approved by {actor}: {reason}"[:5000])
    move.reason = f"approved by {approver}: the canary decides"
    return ApprovalAction(version=version, outcome="approved", approver=approver, canary_due=True,
                          action=f"v{version} approved by {approver}: challenger; the canary decides")


def decide_by_hand(params: Params, version: str, word: str, reason: str, actor: str, approver: str
                   ) -> ApprovalAction:
    """`torchship approve|reject VERSION --reason`: the person is the OS user who ran it."""
    if not reason.strip():
        raise TorchshipError(f"say why: torchship {word[:-1]} VERSION --reason \"...\" (recorded in the history)")
    return decide(registry_client(params.tracking), params.data.registered_model_name(), str(version), word,
                  approver, actor, reason, params.promotion.approval_timeout_s)


def review_approvals(params: Params, observer: str, client=None) -> tuple[list[ApprovalAction], list[Waiting]]:
    """Act on every open decision of the project's model (a tag set in the MLflow UI, a timeout), as `observer`
    noticed it; returns (what was done, the versions still waiting). Versions not asked are not read twice."""
    client = client or registry_client(params.tracking)
    name = params.data.registered_model_name()
    timeout_s = params.promotion.approval_timeout_s
    acted, waiting = [], []
    found_all = client.search_model_versions(f"name='{name}'")
    for found in sorted(found_all, key=lambda v: int(v.version)):   # oldest first: the first approved goes first
        view = approval_view(found.tags, time.time(), timeout_s)
        version = str(found.version)
        if view.state is ApprovalState.WAITING:   # its notice again, in case register's was not delivered (once)
            waiting.append(Waiting(version=version, requested=view.requested, deadline=view.deadline))
            notify_once(client, approval_notice(name, version, view.deadline), params.notify)
        elif view.open():
            acted.append(decide(client, name, version, view.state.value, view.approver, _noticed(view, observer),
                                _why(view, found.tags), timeout_s))
    return acted, waiting


def review_quietly(params: Params, observer: str) -> tuple[list[ApprovalAction], list[Waiting]]:
    """`review_approvals` for an observer whose own work goes on whatever happens here (the monitor, status)."""
    try:
        return review_approvals(params, observer)
    except Exception as exc:
        log.warning("approvals could not be reviewed (%s): %s", observer, exc)
        return [], []


def approved_challenger_without_canary(params: Params) -> str | None:
    """The challenger when a person approved it and no canary step has judged it yet (the monitor starts one)."""
    client = registry_client(params.tracking)
    challenger = alias_version(client, params.data.registered_model_name(), CHALLENGER)
    if challenger is None or DECIDED_TAG not in challenger.tags:
        return None
    tags = challenger.tags
    if tags.get(APPROVAL_TAG, "").startswith("approved") and not any(key.startswith("canary.") for key in tags):
        return str(challenger.version)
    return None


def _noticed(view: ApprovalView, observer: str) -> str:
    if view.state is ApprovalState.TIMED_OUT:
        return observer
    return f"{view.approver} (tag {APPROVAL_TAG} set outside torchship, noticed by {observer})"


def _why(view: ApprovalView, tags: dict[str, str]) -> str:
    if view.state is ApprovalState.TIMED_OUT:
        return "nobody decided in time"
    return f"the MLflow tag {APPROVAL_TAG}={tags.get(APPROVAL_TAG, '')!r}"


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
