"""tasks/core/gate.py: the one gate result type and the warn_blocks policy."""
from __future__ import annotations

import pytest

from tasks.core.errors import GateFailed
from tasks.core.gate import GateResult


@pytest.mark.parametrize("failures, warnings, status", [
    ([], [], "pass"),
    ([], ["odd"], "warn"),
    (["broken"], [], "fail"),
    (["broken"], ["odd"], "fail"),
])
def test_decide_takes_the_worst_status(failures, warnings, status):
    assert GateResult.decide("g", failures, warnings).status == status


def test_decide_keeps_every_reason_failures_first():
    result = GateResult.decide("g", ["f1", "f2"], ["w1"])
    assert result.reasons == ["f1", "f2", "w1"]


def test_decide_uses_the_passed_text_only_when_clean():
    assert GateResult.decide("g", [], passed="12 checks").reasons == ["12 checks"]
    assert "12 checks" not in GateResult.decide("g", [], ["w"], passed="12 checks").reasons


@pytest.mark.parametrize("status, warn_blocks, blocks", [
    ("pass", False, False), ("pass", True, False),
    ("warn", False, False), ("warn", True, True),
    ("fail", False, True), ("fail", True, True),
])
def test_blocks_follows_the_policy(status, warn_blocks, blocks):
    assert GateResult(gate="g", status=status).blocks(warn_blocks) is blocks


def test_enforce_raises_with_gate_reasons_and_evidence():
    result = GateResult.decide("data contract", ["train: nulls in 'age'"], evidence="data/validate/docs/index.html")
    with pytest.raises(GateFailed) as caught:
        result.enforce()
    message = str(caught.value)
    assert "data contract" in message and "fail" in message
    assert "nulls in 'age'" in message and "data/validate/docs/index.html" in message


def test_enforce_lets_a_warning_through_unless_warnings_block():
    result = GateResult.decide("g", [], ["unseen category"])
    assert result.enforce(warn_blocks=False) is result
    with pytest.raises(GateFailed, match="unseen category"):
        result.enforce(warn_blocks=True)


def test_status_outside_the_three_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        GateResult(gate="g", status="ok")
