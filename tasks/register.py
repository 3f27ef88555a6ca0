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
from tasks.ops.passport import passport_html, passport_markdown
from tasks.ops.registry import promote, reject

log = logging.getLogger("torchship.register")


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
    description = passport_markdown(params, blessing, tags, version)
    client.update_model_version(name, version, description=description)
    mlflow.log_text(description, "passport.md")
    mlflow.log_text(passport_html(description), "passport.html")
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
