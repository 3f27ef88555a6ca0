"""The approval step's rules, pure: where a version stands, read from its tags (promotion.approval: required).

A version that awaits approval carries `approval_requested` (when register asked, epoch seconds) and `approval`:
`waiting`, until a person writes `approved:<name>` or `rejected:<name>` (in the MLflow UI, or through
`torchship approve|reject`). The observer that acts on it adds `approval_decided`, after which nothing reads the
version again. Tag values are what a person types in a form: case and spaces around the name do not matter."""
from __future__ import annotations

import time
from enum import StrEnum

from pydantic import BaseModel

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
