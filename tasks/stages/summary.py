"""The end-of-run summary: one row per step, the registry outcome, where to look next."""
from __future__ import annotations

from pydantic import BaseModel

from tasks.core import paths
from tasks.core.verdicts import BLESS_STAGES, Blessing, CanaryOutcome, CanaryReport, Registration, RegistrationOutcome
from tasks.stages.repro import StageOutcome


class StepRow(BaseModel):
    step: str
    status: str
    seconds: float
    headline: str


class PipelineSummary(BaseModel):
    model_name: str
    steps: list[StepRow]
    version: str | None = None
    aliases: dict[str, str] = {}
    verdict: str = ""
    pipeline_run: str | None = None
    reports: dict[str, str] = {}

    def markdown(self) -> str:
        rows = "\n".join(f"| {s.step} | {s.status} | {s.seconds:.1f}s | {s.headline} |" for s in self.steps)
        aliases = ", ".join(f"{k} → v{v}" for k, v in sorted(self.aliases.items())) or "none"
        reports = "\n".join(f"- {k}: `{v}`" for k, v in self.reports.items())
        return (f"# torchship pipeline: {self.model_name}\n\n| step | status | time | headline |\n|---|---|---|---|\n"
                f"{rows}\n\n**Model version:** v{self.version} · **aliases:** {aliases}\n\n"
                f"**Verdict:** {self.verdict}\n\n**Reports**\n{reports}\n")


REPORTS = {"Data Docs (GX)": str(paths.DATA_DOCS / "index.html"),
           "learning curves": str(paths.TRAIN_PLOTS / "learning_curves.png"),
           "confusion matrix": str(paths.TRAIN_PLOTS / "confusion_matrix.png"),
           "parity": str(paths.PARITY_REPORT), "latency chart": str(paths.LATENCY_PLOT),
           "profile": str(paths.PROFILE_REPORT)}


def bless_headline(blessing: Blessing) -> str:
    """The bless gate's reasons, and which stages a failure left unrun."""
    not_run = [stage for stage in BLESS_STAGES if blessing.stages and blessing.stage(stage) is None]
    return "; ".join(blessing.gate.reasons) + (f" ({', '.join(not_run)}: not run)" if not_run else "")


def summarize(outcomes: list[StageOutcome], blessing: Blessing, registration: Registration, canary: CanaryReport,
              pipeline_run: str) -> PipelineSummary:
    """One row per step and the verdict in words."""
    steps = [StepRow(step=o.stage, status=o.status, seconds=o.seconds, headline=o.headline) for o in outcomes]
    steps += [
        StepRow(step="bless", status=blessing.gate.status, seconds=blessing.seconds, headline=bless_headline(blessing)),
        StepRow(step="register", status="new version" if registration.created else "reused",
                seconds=registration.seconds, headline=registration.action),
        StepRow(step="canary", status=canary.gate.status, seconds=canary.seconds,
                headline=f"{canary.action}: {'; '.join(canary.gate.reasons)}"),
    ]
    if registration.outcome is RegistrationOutcome.REJECTED:
        verdict = registration.action + ("; the champion keeps serving" if "champion" in canary.aliases
                                         else "; there is no champion yet, so nothing is served")
    elif registration.outcome is RegistrationOutcome.REUSED:
        verdict = f"{registration.action}"
    else:
        verdict = registration.action if canary.outcome is CanaryOutcome.SMOKE_TESTED else canary.action
    return PipelineSummary(model_name=registration.model_name, steps=steps, version=registration.version,
                           aliases=canary.aliases, verdict=verdict, pipeline_run=pipeline_run, reports=REPORTS)
