"""bless: is the candidate at least as good as the live champion on the same holdout? (Prefect-only)

Recomputed every run: the champion is live registry state, which DVC cannot hash.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from tasks import layout
from tasks.artifacts import read_json, sha256_file
from tasks.config import BlessParams, Params
from tasks.contract import Schema
from tasks.export import onnx_runner
from tasks.gate import GateResult
from tasks.holdout import load_holdout
from tasks.metrics import evaluate
from tasks.registry import CHAMPION, alias_version, download_onnx, registry_client

log = logging.getLogger("torchship.bless")


class Blessing(BaseModel):
    seconds: float = 0.0
    gate: GateResult
    model_name: str
    candidate_path: str
    candidate_sha256: str
    candidate_metrics: dict[str, float]
    champion_version: str | None = None
    champion_metrics: dict[str, float] | None = None


def decide(candidate: dict[str, float], champion: dict[str, float] | None, comparable: bool,
           rules: BlessParams, champion_version: str | None = None) -> GateResult:
    """Pure core: pass if there is no champion, or the candidate does not lose on the bless metric."""
    metric = rules.metric
    if champion is None:
        return GateResult.decide("bless", [], passed=f"first model: no champion to compare with "
                                                     f"({metric} {candidate[metric]:.4f})")
    if not comparable:
        return GateResult.decide("bless", [f"input signature differs from champion v{champion_version}: not comparable; "
                                           "register under a new data.model_name or re-baseline explicitly"])
    needed = champion[metric] + rules.min_improvement
    verdict = (f"{metric} {candidate[metric]:.4f} vs champion v{champion_version} {champion[metric]:.4f} "
               f"(needs >= {needed:.4f})")
    return GateResult.decide("bless", [] if candidate[metric] >= needed else [verdict], passed=verdict)


def score_onnx(path: Path, schema: Schema) -> dict[str, float]:
    """Metrics of an ONNX model on the holdout, encoded with that model's own schema."""
    holdout = load_holdout(schema)
    return evaluate(onnx_runner(path, threads=2), holdout.features, holdout.labels, len(schema.classes))


def bless_candidate(params: Params) -> Blessing:
    """Score the selected variant and the live champion on the same holdout and decide."""
    from tasks.contract import load_schema

    started = time.perf_counter()
    profile = read_json(layout.PROFILE_REPORT)
    path = Path(profile["selected_path"])
    schema = load_schema(layout.SCHEMA)
    name = params.data.registered_model_name()
    sha = sha256_file(path)
    candidate = score_onnx(path, schema)
    client = registry_client(params.tracking)
    champion = alias_version(client, name, CHAMPION)
    champion_metrics, comparable = None, True
    if champion is not None:
        with tempfile.TemporaryDirectory() as folder:
            champion_path = download_onnx(name, champion.version, Path(folder))
            champion_schema = _onnx_schema(champion_path)
            comparable = champion_schema.signature() == schema.signature()
            if comparable:
                champion_metrics = score_onnx(champion_path, champion_schema)
        champion_metrics = champion_metrics or {}
    gate = decide(candidate, champion_metrics if champion is not None else None, comparable, params.bless,
                  str(champion.version) if champion else None)
    blessing = Blessing(gate=gate, model_name=name, candidate_path=str(path), candidate_sha256=sha,
                        candidate_metrics=candidate, champion_version=str(champion.version) if champion else None,
                        champion_metrics=champion_metrics,
                        seconds=time.perf_counter() - started)
    log.info("bless: %s", gate.summary())
    return blessing


def _onnx_schema(path: Path) -> Schema:
    import onnx

    from tasks.contract import schema_from_metadata

    return schema_from_metadata({p.key: p.value for p in onnx.load(str(path)).metadata_props})
