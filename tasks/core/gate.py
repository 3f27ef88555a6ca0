"""The one gate result type: every gate (data, parity, accuracy, bless, canary, drift) returns this."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from tasks.core.errors import GateFailed

Status = Literal["pass", "warn", "fail"]


class GateResult(BaseModel):
    gate: str
    status: Status
    reasons: list[str] = []
    evidence: str | None = None  # path or URI of the report behind the decision

    @classmethod
    def decide(cls, gate: str, failures: list[str], warnings: list[str] = (), evidence: str | None = None,
               passed: str = "all checks passed") -> GateResult:
        """fail if anything failed, else warn if anything warned, else pass."""
        status: Status = "fail" if failures else ("warn" if warnings else "pass")
        reasons = list(failures) + list(warnings) or [passed]
        return cls(gate=gate, status=status, reasons=reasons, evidence=evidence)

    def blocks(self, warn_blocks: bool) -> bool:
        return self.status == "fail" or (self.status == "warn" and warn_blocks)

    def enforce(self, warn_blocks: bool = False) -> GateResult:
        """Raise GateFailed when the policy says this result stops the pipeline."""
        if self.blocks(warn_blocks):
            where = f" Evidence: {self.evidence}." if self.evidence else ""
            raise GateFailed(f"{self.gate} gate: {self.status}: " + "; ".join(self.reasons) + "." + where)
        return self

    def summary(self) -> str:
        return f"{self.status}: " + "; ".join(self.reasons)
