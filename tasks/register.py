"""register: log the selected ONNX variant to the MLflow registry with lineage and set aliases (Prefect-only)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from tasks.config import Params
from tasks.contract import load_schema
from tasks.core import paths
from tasks.core.artifacts import read_json
from tasks.core.holdout import load_holdout
from tasks.core.registry import (CHALLENGER, CHAMPION, SHA_TAG, alias_version, aliases, find_version_by_sha,
                                 registry_client)
from tasks.core.verdicts import Blessing, Registration
from tasks.ops.lineage import lineage_tags
from tasks.ops.registry import promote, reject

log = logging.getLogger("torchship.register")


def passport(blessing: Blessing, tags: dict[str, str], profile: dict, compress: dict | None = None,
             baselines: dict | None = None) -> str:
    """The version's description in the MLflow UI: data version, gates, figures vs champion, verdict."""
    selected = profile["variants"][profile["selected"]]
    budget = ((compress or {}).get("variants") or {}).get(profile["selected"])
    proof = (f"; accuracy budget {budget['gate']['status']}: {budget['gate']['reasons'][0]} vs the fp32 teacher"
             if budget else "; the fp32 teacher itself (parity-gated export)")
    champion = blessing.champion_metrics or {}
    models = (baselines or {}).get("models", {})
    rows = "\n".join(f"| {k} | {v:.4f} | " + (f"{champion[k]:.4f}" if k in champion else "—") + " | "
                     + " | ".join(f"{b[k]:.4f}" for b in models.values()) + " |"
                     for k, v in blessing.candidate_metrics.items())
    baseline_columns = "".join(f" {name.replace('_', ' ')} (scikit-learn) |" for name in models)
    return (f"## torchship model passport\n\n"
            f"**Verdict:** bless {blessing.gate.status}: {'; '.join(blessing.gate.reasons)}\n\n"
            f"| holdout metric | this version | champion v{blessing.champion_version or '—'} |{baseline_columns}\n"
            f"|---|---|---|{'---|' * len(models)}\n{rows}\n\n"
            f"**Variant:** {profile['selected']}: batch-1 p50 {selected['p50_us']:.0f} µs, "
            f"p99 {selected['p99_us']:.0f} µs, {selected['rows_per_s']:,.0f} rows/s at batch "
            f"{profile.get('batch_size', '')}{proof}\n\n"
            f"**Lineage:** git {tags.get('git_commit', '?')[:12]} (dirty: {tags.get('git_dirty')}), "
            f"training data md5 {tags.get('dvc_train_md5', '?')}, train params md5 {tags.get('dvc_train_params_md5', '?')}.\n"
            f"Rebuild: `git checkout {tags.get('git_commit', '?')[:12]} && dvc pull && dvc repro`.\n")


def register_candidate(params: Params, blessing: Blessing, run_id: str | None = None,
                       trigger: dict[str, str] | None = None) -> Registration:
    """Register (or reuse, for identical bytes) the candidate and apply the registry protocol."""
    import mlflow
    import onnx
    from mlflow.models import infer_signature

    started = time.perf_counter()
    client = registry_client(params.tracking)
    name = blessing.model_name
    existing = find_version_by_sha(client, name, blessing.candidate_sha256)
    if existing is not None:
        return Registration(model_name=name, version=str(existing.version), created=False,
                            action=f"same bytes as v{existing.version}: no new version, aliases unchanged",
                            aliases=aliases(client, name), seconds=time.perf_counter() - started)
    schema = load_schema(paths.SCHEMA)
    example = np.nan_to_num(load_holdout(schema).features[:5])
    profile = read_json(paths.PROFILE_REPORT)
    tags = {**lineage_tags(Path(".")), SHA_TAG: blessing.candidate_sha256, "variant": profile["selected"],
            "bless": blessing.gate.status, "bless_reasons": "; ".join(blessing.gate.reasons)[:4000],
            "data_source": params.data.source}
    if blessing.champion_version:
        tags["parent_version"] = blessing.champion_version
    if run_id:
        tags["pipeline_run"] = run_id
    tags.update(trigger or {})
    info = mlflow.onnx.log_model(onnx.load(blessing.candidate_path), name="model",
                                 registered_model_name=name, signature=infer_signature(example),
                                 onnx_execution_providers=["CPUExecutionProvider"])
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    baselines = read_json(paths.BASELINE_REPORT) if paths.BASELINE_REPORT.exists() else None
    client.update_model_version(name, version, description=passport(blessing, tags, profile,
                                                                    read_json(paths.COMPRESS_REPORT), baselines))
    action = apply_aliases(client, name, version, blessing)
    return Registration(model_name=name, version=version, created=True, action=action, aliases=aliases(client, name),
                        seconds=time.perf_counter() - started)


def apply_aliases(client, name: str, version: str, blessing: Blessing) -> str:
    """Not blessed -> tagged rejected (a first model too: never a champion worse than the baselines);
    no champion yet -> champion; else challenger (the canary decides)."""
    if blessing.gate.status == "fail":
        reject(client, name, version, "bless: " + "; ".join(blessing.gate.reasons))
        return f"v{version} rejected by bless: {'; '.join(blessing.gate.reasons)}"
    if alias_version(client, name, CHAMPION) is None:
        promote(client, name, version, "first model of this name")
        return f"v{version} is champion (first model)"
    client.set_registered_model_alias(name, CHALLENGER, version)
    return f"v{version} is challenger; the canary decides"


def run(params: Params, blessing: Blessing, parent_run: str | None = None,
        trigger: dict[str, str] | None = None) -> Registration:
    """The step: register under a nested MLflow run (the model is logged from it); `trigger` tags a new
    version with why its pipeline ran (a retrain names its window's batch)."""
    from tasks.core.tracking import stage_run

    with stage_run(params.tracking, "register", parent_run):
        registration = register_candidate(params, blessing, parent_run, trigger)
    log.info("register: %s", registration.action)
    return registration
