"""What each Prefect-only step hands the next (and the summary): typed, so no step imports another."""
from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel

from tasks.core.gate import GateResult

BlessStage = Literal["quality", "performance", "service"]
BLESS_STAGES: tuple[BlessStage, ...] = ("quality", "performance", "service")   # the order bless runs them in
OUTCOME_TAG = "bless_outcome"   # the registered version's tag holding its BlessOutcome (rebaseline reads it)


class BlessOutcome(StrEnum):
    """What bless decided, for code to branch on; the gate's reasons say it in words, for people."""

    FIRST_MODEL = "first model"                # pass: no champion yet, and not below the baselines
    UNCHANGED = "unchanged"                    # pass: the candidate is the champion's own bytes: nothing to judge
    BETTER = "better"                          # pass: the gain's interval lies above 0
    NO_WORSE = "no worse"                      # pass: not worse, not shown better
    WORSE_WITHIN_TOLERANCE = "worse within tolerance"   # warn: a loss within bless.max_regression
    REGRESSION = "regression"                  # fail: a loss beyond bless.max_regression
    SLICE_REGRESSION = "slice regression"      # fail: a real loss on a declared slice
    BELOW_BASELINES = "below baselines"        # fail: worse than scikit-learn beyond bless.max_baseline_gap
    INCOMPARABLE = "incomparable"              # fail: the champion's input signature or classes differ
    PERFORMANCE_FAILED = "performance failed"  # fail: the performance stage (after quality passed)
    SERVICE_FAILED = "service failed"          # fail: the service stage


class RegistrationOutcome(StrEnum):
    """What register did with the candidate's version, for code to branch on (`Registration.action`: in words)."""

    REUSED = "reused"            # the same bytes are an existing version: nothing new, aliases unchanged
    REJECTED = "rejected"        # bless failed: tagged rejected, no alias
    STALE = "stale"              # the aliases moved while bless ran: registered without an alias
    CHAMPION = "champion"        # the first model of this name
    CHALLENGER = "challenger"    # the canary decides
    AWAITING_APPROVAL = "awaiting approval"   # promotion.approval required: no alias until a person approves


class StageReport(BaseModel):
    """One bless stage: its gate, its key figures in one line, and its full report (per class, per slice,
    per variant, the machine...)."""

    stage: BlessStage
    gate: GateResult
    seconds: float = 0.0
    headline: str = ""
    details: dict[str, Any] = {}
    outcome: BlessOutcome | None = None   # the quality stage's decision (the other stages decide pass/fail only)


class Blessing(BaseModel):
    """bless: the candidate vs the scikit-learn baselines and the live champion on the same holdout (quality), on
    this machine (performance) and in the real service (service); the stages run in order and stop at the first
    failure, and `gate` combines those that ran."""

    seconds: float = 0.0
    gate: GateResult
    outcome: BlessOutcome
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
    outcome: RegistrationOutcome
    action: str                 # what happened to the aliases, in words
    aliases: dict[str, str]


StepStatus = Literal["pass", "fail", "short"]


class VariantFigures(BaseModel):
    """One variant in one step. `requests`/`errors`: what it answered (in the shadow phase, what it scored in
    shadow); `p95_ms`: of its answers (none in shadow); `labels`/`labelled`/`correct`: the rows it scored, answered
    or in shadow (those both variants scored, when there are any)."""

    version: str
    requests: int = 0
    errors: int = 0
    p95_ms: float | None = None
    labels: dict[str, int] = {}   # predicted class -> rows
    labelled: int = 0             # rows with a feedback label
    correct: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.labelled if self.labelled else None


class PairedRows(BaseModel):
    """The rows of one step both variants scored (each distinct row once): how each pair of predicted classes
    occurred, and on the labelled ones, where exactly one variant was right (the rows a paired test reads)."""

    rows: int = 0
    classes: dict[str, dict[str, int]] = {}   # champion's class -> challenger's class -> rows
    labelled: int = 0
    champion_only: int = 0         # labelled rows only the champion got right
    challenger_only: int = 0       # labelled rows only the challenger got right


class StepStatistics(BaseModel):
    """How the step's quality checks were judged: the paired accuracy drop and its exact p-value, the PSI's
    permutation p-value, the level each is tested at, and the labelled pairs a drop of max_metric_drop needs."""

    alpha: float                   # per check at this look: (1 - canary.confidence) / (phases * 2 checks * 2^look)
    look: int = 1                  # the step's first judgement, or a later one on more rows
    drop: float | None = None
    drop_p: float | None = None
    pairs_needed: int | None = None
    psi_p: float | None = None
    latency_only: bool = False     # latency was the step's one failure: it must reproduce on fresh requests
    load: dict[str, float] = {}    # the machine's load while the step filled (tasks/core/machine.py)


class StepVerdict(BaseModel):
    """One step: its share, what each variant did, the PSI between them, and pass, fail or short (too few
    samples within step_max_s) with the reasons."""

    phase: str                   # "shadow" or "5%", "25%", ...
    share: float
    status: StepStatus
    reasons: list[str]
    champion: VariantFigures
    challenger: VariantFigures
    psi: float | None = None
    seconds: float = 0.0
    pairs: PairedRows | None = None
    statistics: StepStatistics | None = None


class CanaryOutcome(StrEnum):
    """What a canary did: code branches on this; `CanaryReport.action` says it in words for people."""

    PROMOTED = "promoted"              # every step passed: the challenger is champion
    ROLLED_BACK = "rolled back"        # a step failed: the challenger is rejected, the champion unchanged
    INCONCLUSIVE = "inconclusive"      # a step got too little traffic: nothing moved, still challenger
    SUPERSEDED = "superseded"          # `challenger` moved to another version during the canary: nothing moved
    NOT_COMPARABLE = "not comparable"  # another input signature or classes than the champion's: not run
    SMOKE_TESTED = "smoke tested"      # no challenger: the champion alone answered the replayed rows
    NOT_CANARIED = "not canaried"      # nothing to canary: no champion, or no challenger on a live service


class CanaryReport(BaseModel):
    """canary: the gate, what it did (`outcome`; `action` in words), and what led there: each step of the
    progressive canary, or the champion's figures in the smoke test (no challenger)."""

    seconds: float = 0.0
    gate: GateResult
    outcome: CanaryOutcome
    action: str
    steps: list[StepVerdict] = []
    smoke: VariantFigures | None = None
    aliases: dict[str, str] = {}
