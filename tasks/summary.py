"""The end-of-run summary: one row per step, the registry outcome, where to look next."""
from __future__ import annotations

from pydantic import BaseModel

from tasks import layout


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


REPORTS = {"Data Docs (GX)": str(layout.DATA_DOCS / "index.html"),
           "learning curves": str(layout.TRAIN_PLOTS / "learning_curves.png"),
           "confusion matrix": str(layout.TRAIN_PLOTS / "confusion_matrix.png"),
           "parity": str(layout.PARITY_REPORT), "latency chart": str(layout.LATENCY_PLOT),
           "profile": str(layout.PROFILE_REPORT)}
