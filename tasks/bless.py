"""bless: is the candidate no worse than the scikit-learn baselines, and at least as good as the live champion,
on the same holdout? (Prefect-only)

Recomputed every run: the champion is live registry state, which DVC cannot hash.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from tasks.config import BlessParams, Params
from tasks.contract import Schema, load_schema, schema_from_metadata
from tasks.core import paths
from tasks.core.artifacts import read_json, sha256_file
from tasks.core.gate import GateResult
from tasks.core.holdout import load_holdout
from tasks.core.metrics import evaluate
from tasks.core.registry import CHAMPION, alias_version, download_onnx, registry_client
from tasks.core.runtime import onnx_metadata, onnx_runner
from tasks.core.verdicts import Blessing

log = logging.getLogger("torchship.bless")


def decide(candidate: dict[str, float], champion: dict[str, float] | None, comparable: bool,
           rules: BlessParams, champion_version: str | None = None, baselines: dict | None = None) -> GateResult:
    """Pure core: fail when the candidate is worse than the best scikit-learn baseline beyond
    `max_baseline_gap` (first model included); else pass if there is no champion, or the candidate does not
    lose on the bless metric."""
    metric = rules.metric
    against_baselines = ""
    if baselines:
        best = max(baselines, key=lambda name: baselines[name][metric])
        floor = baselines[best][metric] - rules.max_baseline_gap
        figures = ", ".join(f"{name.replace('_', ' ')} {b[metric]:.4f}" for name, b in baselines.items())
        if candidate[metric] < floor:
            return GateResult.decide("bless", [
                f"worse than a few lines of scikit-learn: {metric} {candidate[metric]:.4f} is "
                f"{baselines[best][metric] - candidate[metric]:.4f} below the {best.replace('_', ' ')} baseline "
                f"{baselines[best][metric]:.4f} on the same holdout (bless.max_baseline_gap {rules.max_baseline_gap}; "
                f"baselines: {figures})"])
        against_baselines = f"; baselines: {figures}"
    if champion is None:
        return GateResult.decide("bless", [], passed=f"first model: no champion to compare with "
                                                     f"({metric} {candidate[metric]:.4f}{against_baselines})")
    if not comparable:
        return GateResult.decide("bless", [f"input signature differs from champion v{champion_version}: not comparable; "
                                           "register under a new data.model_name or re-baseline explicitly"])
    needed = champion[metric] + rules.min_improvement
    verdict = (f"{metric} {candidate[metric]:.4f} vs champion v{champion_version} {champion[metric]:.4f} "
               f"(needs >= {needed:.4f}){against_baselines}")
    return GateResult.decide("bless", [] if candidate[metric] >= needed else [verdict], passed=verdict)


def score_onnx(path: Path, schema: Schema, threads: int) -> dict[str, float]:
    """Metrics of an ONNX model on the holdout, encoded with that model's own schema."""
    holdout = load_holdout(schema)
    return evaluate(onnx_runner(path, threads), holdout.features, holdout.labels, len(schema.classes))


def bless_candidate(params: Params) -> Blessing:
    """Score the selected variant and the live champion on the same holdout and decide."""
    started = time.perf_counter()
    path = Path(read_json(paths.PROFILE_REPORT)["selected_path"])
    schema = load_schema(paths.SCHEMA)
    name = params.data.registered_model_name()
    threads = params.runtime.threads
    candidate = score_onnx(path, schema, threads)
    client = registry_client(params.tracking)
    champion = alias_version(client, name, CHAMPION)
    champion_metrics, comparable = None, True
    if champion is not None:
        with tempfile.TemporaryDirectory() as folder:
            champion_path = download_onnx(client, name, champion.version, Path(folder))
            champion_schema = schema_from_metadata(onnx_metadata(champion_path))
            comparable = champion_schema.signature() == schema.signature()
            champion_metrics = score_onnx(champion_path, champion_schema, threads) if comparable else {}
    baselines = read_json(paths.BASELINE_REPORT)["models"] if paths.BASELINE_REPORT.exists() else None
    gate = decide(candidate, champion_metrics, comparable, params.bless,
                  str(champion.version) if champion else None, baselines)
    return Blessing(gate=gate, model_name=name, candidate_path=str(path), candidate_sha256=sha256_file(path),
                    candidate_metrics=candidate, champion_version=str(champion.version) if champion else None,
                    champion_metrics=champion_metrics, baseline_metrics=baselines or {},
                    seconds=time.perf_counter() - started)


def run(params: Params, parent_run: str | None = None) -> Blessing:
    """The step: bless the candidate and log the decision as a nested MLflow run."""
    import mlflow

    from tasks.core.tracking import stage_run

    with stage_run(params.tracking, "bless", parent_run):
        blessing = bless_candidate(params)
        mlflow.log_dict(blessing.model_dump(), "bless.json")
        mlflow.log_metrics({f"candidate_{k}": v for k, v in blessing.candidate_metrics.items()}
                           | {f"baseline_{name}_{k}": v for name, figures in blessing.baseline_metrics.items()
                              for k, v in figures.items() if k != "fit_seconds"})
        mlflow.set_tag("gate.status", blessing.gate.status)
    log.info("bless: %s", blessing.gate.summary())
    return blessing
