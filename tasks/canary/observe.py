"""What a canary step sees of a running service: its /metrics (requests, errors and latency by variant, as
counter and histogram deltas over the step) and its logs (served rows, shadow answers, feedback labels, by row id;
tasks/core/servelog.py). The figures are built from these by a pure function (step_figures)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tasks.canary.analysis import histogram_quantile
from tasks.core.runtime import EMBEDDING
from tasks.core.servelog import feedback_path, served_files, shadow_path
from tasks.core.verdicts import PairedRows, VariantFigures
from tasks.registry.read import CHALLENGER, CHAMPION

REQUESTS, LATENCY = "torchship_requests_total", "torchship_request_seconds_bucket"


@dataclass
class Scrape:
    """The service's request counters by (variant, version, status) and latency buckets by variant."""

    counts: dict[tuple[str, str, str], float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        from prometheus_client.parser import text_string_to_metric_families

        scrape = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == REQUESTS:
                    scrape.counts[(labels["variant"], labels["version"], labels["status"])] = sample.value
                elif sample.name == LATENCY:
                    scrape.buckets.setdefault(labels["variant"], {})[float(labels["le"])] = sample.value
        return scrape

    def minus(self, before: Scrape) -> Scrape:
        """What happened between `before` and this scrape."""
        return Scrape({k: v - before.counts.get(k, 0.0) for k, v in self.counts.items()},
                      {variant: {le: v - before.buckets.get(variant, {}).get(le, 0.0) for le, v in b.items()}
                       for variant, b in self.buckets.items()})

    def count(self, variant: str, version: str, status: str) -> int:
        return int(self.counts.get((variant, version, status), 0.0))

    def p95_ms(self, variant: str) -> float | None:
        buckets = sorted(self.buckets.get(variant, {}).items())
        value = histogram_quantile(0.95, buckets)
        return None if value is None else value * 1e3


@dataclass
class StepLogs:
    """The step's lines: served rows, shadow answers (same ids), and feedback labels by row id."""

    served: list[dict]
    shadow: list[dict]
    feedback: dict[str, str]


def read_lines(paths: list[Path], since: float) -> list[dict]:
    """JSON lines with ts >= since, from files touched since then (older rotated files are skipped unread)."""
    lines = []
    for path in paths:
        try:
            if path.stat().st_mtime < since:
                continue
            content = path.read_bytes()
        except FileNotFoundError:   # rotated away between listing and reading
            continue
        for raw in content.splitlines():
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:   # a line being written at this moment
                continue
            if line.get("ts", 0.0) >= since:
                lines.append(line)
    return lines


def read_step_logs(request_log: Path, since: float) -> StepLogs:
    # rotated feedback too: a service that ships its log (serve.ship_to) closes its files every serve.ship_seconds
    feedback = {line["id"]: line["label"] for line in read_lines(served_files(feedback_path(request_log)), since)}
    return StepLogs(served=read_lines(served_files(request_log), since),
                    shadow=read_lines(served_files(shadow_path(request_log)), since), feedback=feedback)


def rows_figures(figures: VariantFigures, lines: list[dict], feedback: dict[str, str]) -> VariantFigures:
    """`figures` with the predicted classes of `lines` and their accuracy on the labelled ones."""
    labelled = [line for line in lines if line["id"] in feedback]
    return figures.model_copy(update={
        "labels": dict(Counter(line["prediction"] for line in lines)), "labelled": len(labelled),
        "correct": sum(feedback[line["id"]] == line["prediction"] for line in labelled)})


def row_key(line: dict) -> bytes:
    """What makes two served rows the same row: their features (a replayed holdout row comes back under a fresh
    id; counting it twice would count its answers twice), an image's without the embedding its model gave (two
    models embed the same image differently). Lines without features: their id."""
    features = line.get("features")
    if features is None:
        return line["id"].encode()
    return orjson.dumps({k: v for k, v in features.items() if k != EMBEDDING}, option=orjson.OPT_SORT_KEYS)


def paired_lines(lines: list[dict], versions: tuple[tuple[str, str], ...]) -> list[list[dict]]:
    """Each variant's lines (answered or in shadow), kept to the row ids both variants scored when there are any,
    each distinct row once: the predictions and accuracies then compare the two on the same rows."""
    mine = [[line for line in lines if (line["variant"], line["version"]) == pair] for pair in versions]
    common = set.intersection(*({line["id"] for line in group} for group in mine))
    if not common:
        return mine
    first_id: dict[bytes, str] = {}
    for line in mine[0]:
        if line["id"] in common:
            first_id.setdefault(row_key(line), line["id"])
    kept = set(first_id.values())
    return [[line for line in group if line["id"] in kept] for group in mine]


def paired_rows(champion_lines: list[dict], challenger_lines: list[dict], feedback: dict[str, str]) -> PairedRows:
    """The rows both variants scored (lines from paired_lines): their predicted classes side by side, and on the
    labelled ones, where only one of them was right."""
    theirs = {line["id"]: line["prediction"] for line in champion_lines}
    pairs = PairedRows()
    for line in challenger_lines:
        if (other := theirs.get(line["id"])) is None:
            continue
        pairs.rows += 1
        row = pairs.classes.setdefault(other, {})
        row[line["prediction"]] = row.get(line["prediction"], 0) + 1
        if (truth := feedback.get(line["id"])) is not None:
            pairs.labelled += 1
            pairs.champion_only += other == truth != line["prediction"]
            pairs.challenger_only += line["prediction"] == truth != other
    return pairs


def step_figures(delta: Scrape, logs: StepLogs, champion_version: str, challenger_version: str,
                 shadow_phase: bool) -> tuple[VariantFigures, VariantFigures, PairedRows]:
    """(champion, challenger) figures of one step, and the rows both scored. In the shadow phase the challenger's
    requests and errors are those of its shadow scoring (its share is 0), and it has no latency to judge (a shadow
    is scored after the answer, in the thread pool: its time is not comparable with an answer's); latency is
    judged from the first traffic step."""
    versions = ((CHAMPION, champion_version), (CHALLENGER, challenger_version))
    figures, groups = [], paired_lines(logs.served + logs.shadow, versions)
    for (alias, version), lines in zip(versions, groups):
        shadowing = shadow_phase and alias == CHALLENGER
        ok, failed = ("shadow", "shadow-error") if shadowing else ("ok", "error")
        answered = VariantFigures(version=version, requests=delta.count(alias, version, ok) +
                                  delta.count(alias, version, failed), errors=delta.count(alias, version, failed),
                                  p95_ms=None if shadowing else delta.p95_ms(alias))
        figures.append(rows_figures(answered, lines, logs.feedback))
    return figures[0], figures[1], paired_rows(*groups, logs.feedback)


def smoke_figures(delta: Scrape, logs: StepLogs, champion_version: str, sent: int) -> VariantFigures:
    """The champion alone on `sent` replayed requests: every one it did not answer `ok` is an error (refused before
    a variant was picked, unavailable, or failed), since all of them were meant for it."""
    answered = delta.count(CHAMPION, champion_version, "ok")
    lines = [line for line in logs.served if (line["variant"], line["version"]) == (CHAMPION, champion_version)]
    figures = VariantFigures(version=champion_version, requests=sent, errors=max(sent - answered, 0),
                             p95_ms=delta.p95_ms(CHAMPION))
    return rows_figures(figures, lines, logs.feedback)


def challenger_samples(delta: Scrape, version: str, shadow_phase: bool) -> int:
    """How many requests the challenger has answered (or scored in shadow) so far in the step."""
    statuses = ("shadow", "shadow-error") if shadow_phase else ("ok", "error")
    return sum(delta.count(CHALLENGER, version, status) for status in statuses)
