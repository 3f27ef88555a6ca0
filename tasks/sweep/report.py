"""What a study found, and what the gates made of it: the finalists in validation order, the rule that makes one the
winner (bless on the holdout, and, with sweep.require_better, a gain over the champion shown there), the study's
optimism (validation minus holdout of the winner), the shared work, and the summary."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.core.verdicts import Blessing, BlessOutcome
from tasks.sweep.study import REASON


def ranked(trials) -> list:
    """Completed trials, best validation score first (ties: the earlier trial)."""
    from optuna.trial import TrialState

    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    return sorted(done, key=lambda t: (-t.value, t.number))


def accepts(blessing: Blessing, require_better: bool) -> tuple[bool, str]:
    """Whether a finalist may be registered: bless passed it, it is not the champion's own file, and (with
    `require_better`, against a live champion) bless found it better, its interval above 0."""
    reasons = "; ".join(blessing.gate.reasons)[:600]
    if blessing.gate.status != "pass":
        return False, f"bless {blessing.gate.status}: {reasons}"
    if blessing.outcome is BlessOutcome.UNCHANGED:
        return False, "the champion's own file: nothing new to register"
    if require_better and blessing.outcome not in (BlessOutcome.BETTER, BlessOutcome.FIRST_MODEL):
        return False, (f"bless: {blessing.outcome} than champion v{blessing.champion_version} on the holdout, not "
                       f"shown better (sweep.require_better): {reasons}")
    return True, f"bless pass ({blessing.outcome}): {reasons}"


@dataclass
class Finalist:
    number: int
    validation: float            # the search's score (validation, or out of fold)
    values: dict[str, Any]
    folder: str
    holdout: float | None = None   # the served variant's score on the holdout, as bless measured it
    accepted: bool = False
    verdict: str = ""

    @property
    def optimism(self) -> float | None:
        return None if self.holdout is None else self.validation - self.holdout


@dataclass
class SweepSummary:
    study: str
    metric: str
    trials: list[dict] = field(default_factory=list)
    finalists: list[Finalist] = field(default_factory=list)
    winner: int | None = None
    registered: str = "nothing registered"
    shared: dict[str, Any] = field(default_factory=dict)

    def winner_finalist(self) -> Finalist | None:
        return next((f for f in self.finalists if f.number == self.winner), None)

    def markdown(self) -> str:
        lines = [f"# sweep {self.study}", "", f"| trial | state | validation {self.metric} | values | stages | note |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for row in self.trials:
            score = "" if row["value"] is None else f"{row['value']:.4f}"
            lines.append(f"| {row['number']} | {row['state']} | {score} | {row['values']} | {row['stages']} | "
                         f"{row['note']} |")
        lines += ["", f"## finalists (re-judged by bless on the holdout, {self.metric})", "",
                  "| trial | validation | holdout | optimism | verdict |", "| --- | --- | --- | --- | --- |"]
        for f in self.finalists:
            holdout = "" if f.holdout is None else f"{f.holdout:.4f}"
            optimism = "" if f.optimism is None else f"{f.optimism:+.4f}"
            lines.append(f"| {f.number} | {f.validation:.4f} | {holdout} | {optimism} | {f.verdict} |")
        winner = self.winner_finalist()
        lines += ["", f"winner: trial {winner.number}, optimism {winner.optimism:+.4f} (validation "
                      f"{winner.validation:.4f}, holdout {winner.holdout:.4f})" if winner and winner.holdout is not None
                  else "winner: none (no finalist passed)", f"registry: {self.registered}",
                  f"shared work: {self.shared}"]
        return "\n".join(lines) + "\n"


def trial_rows(trials) -> list[dict]:
    """Each trial in number order: state, score, values, the stages it ran or skipped, and why it failed."""
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        note = t.user_attrs.get(REASON, "")
        if t.state.name == "FAIL" and not note:
            note = "its worker went silent: queued again"
        if t.user_attrs.get("role") == "champion":
            note = f"the champion's configuration ({t.user_attrs.get('origin', '')}) {note}".strip()
        rows.append({"number": t.number, "state": t.state.name.lower(), "value": t.value,
                     "values": t.user_attrs.get("values", t.params), "stages": t.user_attrs.get("stages", {}),
                     "note": note.splitlines()[0][:300] if note else ""})
    return rows


def shared_work(trials, template: dict[str, Any]) -> dict[str, Any]:
    """How often prepare and validate ran (once in the template, then in each trial where DVC found them changed)
    and how many distinct holdouts the trials saw."""
    stages = [t.user_attrs.get("stages", {}) for t in trials]
    runs = {stage: int(template.get("stages", {}).get(stage) == "ran") + sum(s.get(stage) == "ran" for s in stages)
            for stage in ("prepare", "validate")}
    hashes = {t.user_attrs["holdout_sha256"] for t in trials if "holdout_sha256" in t.user_attrs}
    return {"trials": len(trials), "prepare_runs": runs["prepare"], "validate_runs": runs["validate"],
            "holdout_hashes": len(hashes | {template.get("holdout_sha256")} - {None})}
