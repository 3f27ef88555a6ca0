"""bless: staged benchmarking of the candidate (the variant profile selected) before it is registered, stopping at
the first failure (Prefect-only):
1. quality: against the scikit-learn baselines (the gate's baseline's saved holdout predictions) and the live
   champion re-scored now on the same holdout rows (paired bootstrap intervals of both differences, metrics per
   class and per declared slice);
2. performance: batch-1 latency, batch throughput and size of candidate and champion, measured in this run, on
   this machine (described in the report);
3. service: the candidate file in the real service on 127.0.0.1 under a short bounded load, against `slo`.
One gate (pass | warn | fail with reasons), a JSON report (bless.json) and plots in the nested MLflow run.

Recomputed every run (the champion is live registry state, which DVC cannot hash), but for a candidate that is
the champion's own file: a re-run with nothing changed has nothing to judge.
"""
from __future__ import annotations

import logging
import re
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.bless.performance import assess_performance
from tasks.bless.plots import plot_slices
from tasks.bless.quality import HoldoutPredictions, assess_quality, gate_baselines, gate_predictions, judge_candidate
from tasks.bless.service import try_in_service
from tasks.bless.stages import combine, combine_outcomes, run_stages
from tasks.core import paths
from tasks.core.artifacts import read_json, sha256_file
from tasks.core.gate import GateResult
from tasks.core.machine import describe_machine, load_during
from tasks.core.params_spec import Params
from tasks.core.plots import plot_latency
from tasks.core.runtime import onnx_metadata, open_onnx
from tasks.core.schema_spec import Schema, load_schema, schema_from_metadata
from tasks.core.timing import Timings, confirmed, time_interleaved
from tasks.core.verdicts import Blessing, BlessOutcome, StageReport
from tasks.modalities import input_signature, load_holdout, modality_of
from tasks.modalities.interface import Holdout
from tasks.modalities.scoring import predict_labels as served_labels
from tasks.modalities.scoring import predict_proba
from tasks.registry.read import CHAMPION, SHA_TAG, UNFINISHED_TAG, alias_version, download_onnx, registry_client

__all__ = ["bless_candidate", "judge_candidate", "run", "score_onnx"]   # judge_candidate: quality's rule, tested here
log = logging.getLogger("torchship.bless")
TIMED_ROWS = 64   # distinct one-row frames the batch-1 timing cycles through


@dataclass(frozen=True)
class Champion:
    """The live champion's ONNX file, downloaded for this run, and whether it can be compared at all."""

    version: str
    path: Path
    schema: Schema
    comparable: bool   # same input signature and classes as the candidate


def score_onnx(path: Path, schema: Schema, threads: int) -> dict[str, float]:
    """Metrics of an ONNX model (raw-input or bare) on the holdout's raw rows, read with that model's own schema."""
    from tasks.core.metrics import classification_metrics

    holdout = load_holdout(schema)
    return classification_metrics(holdout.labels, predict_labels(path, schema, holdout, threads),
                                  len(schema.classes))


def predict_labels(path: Path, schema: Schema, inputs: Holdout | pd.DataFrame, threads: int) -> np.ndarray:
    """The class indices (in `schema`'s class order) an ONNX file serves for the holdout (or raw inputs): its own
    decision output."""
    return served_labels(open_onnx(path, threads), schema, inputs.feed if isinstance(inputs, Holdout) else inputs)


def fetch_champion(client, name: str, schema: Schema, folder: Path) -> Champion | None:
    """Download the live champion's file into `folder` (None when there is no champion)."""
    version = alias_version(client, name, CHAMPION)
    if version is None:
        return None
    path = download_onnx(client, name, version.version, folder)
    champion_schema = schema_from_metadata(onnx_metadata(path))
    comparable = (input_signature(champion_schema) == input_signature(schema)
                  and sorted(champion_schema.classes) == sorted(schema.classes))
    return Champion(str(version.version), path, champion_schema, comparable)


def holdout_predictions(path: Path, schema: Schema, holdout: Holdout, champion: Champion | None,
                        threads: int, baseline: np.ndarray | None = None) -> HoldoutPredictions:
    """Both models' predictions on the same raw holdout rows; the champion's mapped into the candidate's classes;
    `baseline`: the gate's baseline's, as the baseline stage saved them (same rows, same class order)."""
    candidate = predict_labels(path, schema, holdout, threads)
    mapped = None
    if champion is not None and champion.comparable:
        order = np.array([schema.classes.index(name) for name in champion.schema.classes])
        mapped = order[predict_labels(champion.path, champion.schema, holdout, threads)]
    return HoldoutPredictions(holdout.rows, holdout.labels, candidate, mapped, schema.classes, baseline)


def measure_performance(path: Path, schema: Schema, holdout: Holdout, champion: Champion | None, params: Params,
                        plots: Path | None) -> StageReport:
    """Time candidate and champion (interleaved, `serve.threads` threads each, as the service runs them) on the
    same raw rows: one-row frames, and batches of `profile.batch_size`."""
    threads, batch_size = params.serve.threads, params.profile.batch_size
    models = {"candidate": partial(predict_proba, open_onnx(path, threads), schema)}
    sizes = {"candidate": path.stat().st_size}
    if champion is not None and champion.comparable:
        models["champion"] = partial(predict_proba, open_onnx(champion.path, threads), champion.schema)
        sizes["champion"] = champion.path.stat().st_size
    items = len(holdout.labels)
    single = [holdout.take(slice(i, i + 1)) for i in range(min(TIMED_ROWS, items))]
    batch = holdout.take(np.resize(np.arange(items), batch_size))
    rules = params.bless

    def measure() -> tuple[Timings, StageReport]:
        with load_during() as load:
            timings = time_interleaved(models, single, batch, rules.latency_rounds, rules.throughput_seconds)
        return timings, assess_performance(timings, sizes, describe_machine(threads), batch_size, params.slo.p99_ms,
                                           rules.max_latency_ratio, load, rules.bootstrap, rules.confidence)

    timings, report = confirmed(measure)
    if plots is not None:
        plot_latency(timings.latencies_us, plots / "bless_latency.png")
    return report


def serve_candidate(path: Path, name: str, predictions: HoldoutPredictions, schema: Schema, holdout: Holdout,
                    params: Params) -> StageReport:
    """The candidate file in the real service, loaded with `slo.bless_requests` one-row (or one-image) holdout
    requests."""
    payloads, positions = modality_of(schema).request_bodies(holdout, schema, params.slo.bless_requests)
    expected = [schema.classes[i] for i in predictions.candidate[positions]]
    return try_in_service(path, name, payloads, expected, params.slo, params.bless.startup_timeout_s,
                          params.bless.bootstrap, params.bless.confidence)


def bless_candidate(params: Params, plots: Path | None = None) -> Blessing:
    """Score the selected variant and the live champion on the same holdout, then run the stages in order
    (stopping at the first failure) and combine them into one gate. Plots go to `plots` when given."""
    started = time.perf_counter()
    path = Path(read_json(paths.PROFILE_REPORT)["selected_path"])
    schema = load_schema(paths.SCHEMA)
    name = params.data.registered_model_name()
    threads = params.runtime.threads
    candidate = score_onnx(path, schema, threads)
    holdout = load_holdout(schema)
    client = registry_client(params.tracking)
    baselines = gate_baselines(read_json(paths.BASELINE_REPORT)) if paths.BASELINE_REPORT.exists() else None
    saved = read_json(paths.BASELINE_PREDICTIONS) if paths.BASELINE_PREDICTIONS.exists() else None
    baseline = gate_predictions(saved, baselines, params.bless.metric, len(holdout.labels))   # None: point rule
    training = ({**read_json(paths.TRAIN_METRICS), "cv_max_rows": params.train.cv_max_rows,
                 "pretrained_freeze": params.train.pretrained.freeze if params.train.pretrained.path else None}
                if paths.TRAIN_METRICS.exists() else None)   # what to advise when the candidate trails the baselines
    with tempfile.TemporaryDirectory() as folder:
        champion = fetch_champion(client, name, schema, Path(folder))
        champion_metrics = None
        if champion is not None:
            champion_metrics = score_onnx(champion.path, champion.schema, threads) if champion.comparable else {}
        predictions = holdout_predictions(path, schema, holdout, champion, threads, baseline)
        stages = run_stages([
            lambda: assess_quality(predictions, params.bless, champion and champion.version,
                                   champion is None or champion.comparable, baselines, training),
            lambda: measure_performance(path, schema, holdout, champion, params, plots),
            lambda: serve_candidate(path, name, predictions, schema, holdout, params),
        ])
    if plots is not None:
        plot_slices(stages[0].details["slices"], params.bless.metric, plots / "bless_slices.png")
    return Blessing(gate=combine(stages), outcome=combine_outcomes(stages), model_name=name,
                    candidate_path=str(path), candidate_sha256=sha256_file(path), candidate_metrics=candidate,
                    champion_version=champion.version if champion else None, champion_metrics=champion_metrics,
                    baseline_metrics=baselines or {}, stages=stages, seconds=time.perf_counter() - started)


def stage_metrics(blessing: Blessing) -> dict[str, float]:
    """The stages' key figures as flat MLflow metrics."""
    figures: dict[str, float] = {}
    for report in blessing.stages:
        figures[f"{report.stage}_seconds"] = report.seconds
        details = report.details
        if report.stage == "quality":
            gain = details.get("gain") or {}
            figures |= {f"gain_{k}": v for k, v in gain.items() if k in ("difference", "low", "high")}
            gap = details.get("baseline_gap") or {}
            figures |= {f"baseline_gap_{k}": v for k, v in gap.items() if k in ("difference", "low", "high")}
            figures |= {f"champion_{k}": v for k, v in (details.get("champion") or {}).items()}
            for column, sliced in details["slices"].items():
                for value, entry in sliced.get("slices", {}).items():
                    key = re.sub(r"[^\w.\- /]", "_", f"slice.{column}.{value}")
                    figures |= {f"{key}.{who}": entry[who] for who in ("candidate", "champion") if who in entry}
        elif report.stage == "performance":
            for model, measured in details["models"].items():
                figures |= {f"{model}_{k}": v for k, v in measured.items()}
        elif report.stage == "service":
            figures |= {f"service_{k}": details[k] for k in ("p50_ms", "p99_ms", "error_rate", "requests_per_s")
                        if k in details}
    return figures


def unchanged_champion(params: Params) -> Blessing | None:
    """The candidate is the live champion's own file (a re-run with nothing changed): a pass with nothing judged,
    since a model compared with itself can only tie, and its service was proven when it became champion."""
    path = Path(read_json(paths.PROFILE_REPORT)["selected_path"])
    name, sha256 = params.data.registered_model_name(), sha256_file(path)
    champion = alias_version(registry_client(params.tracking), name, CHAMPION)
    if champion is None or champion.tags.get(SHA_TAG) != sha256 or UNFINISHED_TAG in champion.tags:
        return None
    return Blessing(gate=GateResult(gate="bless", status="pass", reasons=[
                        f"unchanged: the candidate is champion v{champion.version}'s own file (sha256 {sha256[:12]})"]),
                    outcome=BlessOutcome.UNCHANGED, model_name=name, candidate_path=str(path), candidate_sha256=sha256,
                    candidate_metrics={}, champion_version=str(champion.version))


def run(params: Params, parent_run: str | None = None) -> Blessing:
    """The step: bless the candidate and log the decision, its report and plots as a nested MLflow run (nothing to
    judge or log when the candidate is the champion's own file)."""
    import mlflow

    from tasks.core.tracking import stage_run

    if (unchanged := unchanged_champion(params)) is not None:
        log.info("bless: %s", unchanged.gate.summary())
        return unchanged
    with stage_run(params.tracking, "bless", parent_run) as mlflow_run, \
            tempfile.TemporaryDirectory(prefix="torchship-bless-") as folder:
        blessing = bless_candidate(params, Path(folder))
        blessing.gate.evidence = f"bless.json in MLflow run {mlflow_run.info.run_id}"
        mlflow.log_dict(blessing.model_dump(), "bless.json")
        mlflow.log_metrics({f"candidate_{k}": v for k, v in blessing.candidate_metrics.items()}
                           | {f"baseline_{name}_{k}": v for name, figures in blessing.baseline_metrics.items()
                              for k, v in figures.items() if k != "fit_seconds"} | stage_metrics(blessing))
        mlflow.log_artifacts(folder)
        mlflow.set_tags({"gate.status": blessing.gate.status, "gate.outcome": blessing.outcome}
                        | {f"gate.{report.stage}": report.gate.status for report in blessing.stages})
    log.info("bless: %s", blessing.gate.summary())
    return blessing
