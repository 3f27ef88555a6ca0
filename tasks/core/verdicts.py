"""What each Prefect-only step hands the next (and the summary): typed, so no step imports another."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from tasks.core.gate import GateResult

BlessStage = Literal["quality", "performance", "service"]
BLESS_STAGES: tuple[BlessStage, ...] = ("quality", "performance", "service")   # the order bless runs them in


class StageReport(BaseModel):
    """One bless stage: its gate, its key figures in one line, and its full report (per class, per slice,
    per variant, the machine...)."""

    stage: BlessStage
    gate: GateResult
    seconds: float = 0.0
    headline: str = ""
    details: dict[str, Any] = {}


class Blessing(BaseModel):
    """bless: the candidate vs the scikit-learn baselines and the live champion on the same holdout (quality), on
    this machine (performance) and in the real service (service); the stages run in order and stop at the first
    failure, and `gate` combines those that ran."""

    seconds: float = 0.0
    gate: GateResult
    model_name: str
    candidate_path: str
    candidate_sha256: str
    candidate_metrics: dict[str, float]
    champion_version: str | None = None
    champion_metrics: dict[str, float] | None = None
    baseline_metrics: dict[str, dict[str, float]] = {}   # scikit-learn on the same holdout (the baseline stage)
    stages: list[StageReport] = []                       # those that ran, in order

    def stage(self, name: BlessStage) -> StageReport | None:
        """The report of stage `name`, or None when bless stopped before it."""
        return next((s for s in self.stages if s.stage == name), None)


class Registration(BaseModel):
    """register: the version the candidate maps to and what happened to the aliases."""

    seconds: float = 0.0
    model_name: str
    version: str
    created: bool
    action: str                 # what happened to the aliases, in words
    aliases: dict[str, str]


class VariantTraffic(BaseModel):
    version: str
    requests: int
    errors: int
    accuracy: float
    p50_ms: float
    p95_ms: float


class CanaryReport(BaseModel):
    """canary: the traffic each variant served, the gate, and the promotion or rollback it led to."""

    seconds: float = 0.0
    gate: GateResult
    action: str
    traffic: dict[str, VariantTraffic]
    aliases: dict[str, str] = {}
