"""The approval step's state machine (tasks/registry/approvals.py), pure: waiting -> approved | rejected | timed out ->
settled, read from a version's tags."""
from __future__ import annotations

import pytest

from tasks.registry.approvals import (
    APPROVAL_TAG,
    DECIDED_TAG,
    UNNAMED,
    ApprovalState,
    approval_view,
    parse_decision,
    request_tags,
)

ASKED = 1_000.0
TIMEOUT = 60.0


def view(now: float = ASKED + 1, **tags: str):
    return approval_view({**request_tags(ASKED), **tags}, now, TIMEOUT)


def test_a_version_registered_without_the_step_is_not_asked():
    assert approval_view({"bless": "pass", APPROVAL_TAG: "approved:bob"}, ASKED, TIMEOUT).state \
        is ApprovalState.NOT_ASKED


def test_register_leaves_it_waiting_until_the_deadline_then_it_times_out():
    assert request_tags(ASKED) == {APPROVAL_TAG: "waiting", "approval_requested": "1000"}
    waiting = view()
    assert waiting.state is ApprovalState.WAITING and not waiting.open() and waiting.deadline == ASKED + TIMEOUT
    assert view(now=ASKED + TIMEOUT).state is ApprovalState.WAITING            # at the deadline: still in time
    late = view(now=ASKED + TIMEOUT + 1)
    assert late.state is ApprovalState.TIMED_OUT and late.open()


@pytest.mark.parametrize(("value", "state", "approver"), [
    ("approved:alice", ApprovalState.APPROVED, "alice"),
    ("  Approved: Bob Smith ", ApprovalState.APPROVED, "Bob Smith"),    # typed in the MLflow UI's form
    ("rejected:carol", ApprovalState.REJECTED, "carol"),
    ("approved", ApprovalState.APPROVED, UNNAMED),                       # MLflow records no author of a tag
])
def test_a_person_s_tag_is_a_decision_naming_the_approver(value, state, approver):
    decided = view(**{APPROVAL_TAG: value})
    assert (decided.state, decided.approver) == (state, approver) and decided.open()


def test_a_decision_noticed_after_the_deadline_is_honoured():
    """MLflow keeps no time of a tag write: the person may have decided in time."""
    assert view(now=ASKED + 10 * TIMEOUT, **{APPROVAL_TAG: "approved:alice"}).state is ApprovalState.APPROVED


def test_a_value_that_is_no_decision_keeps_waiting_and_times_out():
    assert parse_decision("aproved:alice") is None
    assert view(**{APPROVAL_TAG: "aproved:alice"}).state is ApprovalState.WAITING
    assert view(now=ASKED + TIMEOUT + 1, **{APPROVAL_TAG: "aproved:alice"}).state is ApprovalState.TIMED_OUT


def test_once_acted_on_a_version_is_settled_whatever_its_tag_says():
    for value in ("approved:alice", "rejected:bob", "waiting"):
        settled = view(now=ASKED + 10 * TIMEOUT, **{APPROVAL_TAG: value, DECIDED_TAG: "done"})
        assert settled.state is ApprovalState.SETTLED and not settled.open()


def test_a_requested_time_edited_into_nonsense_counts_as_due():
    assert approval_view({"approval_requested": "yesterday", APPROVAL_TAG: "waiting"}, ASKED, TIMEOUT).state \
        is ApprovalState.TIMED_OUT
