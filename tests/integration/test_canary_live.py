"""The progressive canary on a running service (`python -m serving` under uvicorn on 127.0.0.1, request log on, admin
token set) while a client sends live traffic with feedback: a challenger that errors, one that is slow and one that
predicts a shifted distribution, each a real ONNX graph built from the champion's, are rolled back at the first step
with enough samples (latency: the first traffic step, where it answers) and the champion is unchanged; a challenger
bless measured better than the champion (the trained network, against a champion made worse from it) waits for a
person's approval, then the canary promotes it step by step, the old champion tagged previous, and the service
serves it. Small min-sample counts and steps through the
params, so each canary takes seconds."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import helper, numpy_helper

from tasks import canary
from tasks.bless import fetch_champion, holdout_predictions
from tasks.bless.quality import assess_quality
from tasks.canary.client import ServiceClient
from tasks.config import load_params
from tasks.core.artifacts import sha256_file
from tasks.core.params_spec import CanaryParams, TrackingParams
from tasks.core.procs import free_port, http_ok, start_child, wait_until_ready
from tasks.core.schema_spec import load_schema
from tasks.core.verdicts import Blessing, BlessOutcome, CanaryOutcome, RegistrationOutcome
from tasks.modalities import load_holdout
from tasks.register import apply_aliases
from tasks.registry.approvals import decide
from tasks.registry.history import read_history
from tasks.registry.read import CHALLENGER, CHAMPION, registry_client
from tests.helpers import registry_restored
from tests.helpers.slow_models import cpu_hog, slowed, through
from tests.helpers.traffic import LiveTraffic

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"
TOKEN = "canary-token"
RULES = CanaryParams(steps=[0.5, 1.0], min_samples=20, step_max_s=60, poll_s=0.2, startup_timeout_s=30)


@pytest.fixture(scope="module")
def live(tiny_pipeline, tmp_path_factory):
    """(project, service, params, MLflow client) of a running service; stopped by PID afterwards, and the registry put
    back as it was (aliases, tags of the old versions, no added versions)."""
    project, _ = tiny_pipeline
    folder = tmp_path_factory.mktemp("canary")
    port, request_log = free_port(), folder / "requests.jsonl"
    child = start_child("service", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", MODEL,
                                    "--request-log", str(request_log), "--poll-seconds", "0.2"],
                        folder / "service.log", cwd=project.root,
                        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
                             "TORCHSHIP_ADMIN_TOKEN": TOKEN})
    params = load_params(project.root / "params.yaml")
    tracking = TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}")
    params = params.model_copy(update={"canary": RULES, "tracking": tracking})
    client = registry_client(tracking)
    url = f"http://127.0.0.1:{port}"
    with registry_restored(client, MODEL):
        try:
            wait_until_ready(child, http_ok(f"{url}/ready"), timeout=90)
            yield project, ServiceClient(url, TOKEN, request_log), params, client
        finally:
            child.stop()
    assert "Traceback" not in child.output_tail(50_000), child.output_tail()


def holdout(project) -> tuple[pd.DataFrame, pd.Series]:
    schema = load_schema(project.root / "data/prepare/schema.json")
    frame = pd.read_parquet(project.root / "data/prepare/holdout.parquet")
    return frame[schema.feature_names], frame[schema.target].astype(str)


def champion_model(client) -> onnx.ModelProto:
    from tasks.registry.read import verified_onnx

    champion = client.get_model_version_by_alias(MODEL, CHAMPION).version
    return onnx.load_from_string(verified_onnx(client, MODEL, champion))


def erroring(model: onnx.ModelProto, column: str) -> onnx.ModelProto:
    """Fails on any row whose numeric `column` is set: its index into the probabilities is out of range (ONNX
    Runtime raises). The warm-up's row of nulls (NaN) passes, so the service loads it."""
    return through(model, [
        helper.make_node("Greater", [column, "lowest"], ["set"]),
        helper.make_node("Cast", ["set"], ["set_int"], to=onnx.TensorProto.INT64),
        helper.make_node("Mul", ["set_int", "far"], ["index"]),
        helper.make_node("Gather", ["inner", "index"], ["probabilities"], axis=0)],
        [numpy_helper.from_array(np.array(-1e300), "lowest"), numpy_helper.from_array(np.array(1000, np.int64), "far")])


# About 100 ms on 2 cores (p95 99 ms alone, 4.8 ms for the champion). Twelve (about 50 ms, p95 in the 25-50 ms bucket)
# passed once beside the whole suite, whose load put two of a step's ~20 champion answers past 10 ms: a p95 over a
# third of the challenger's. Three (about 8 ms) had passed once as the box slowed the champion to 3 ms.
SLOW_PRODUCTS = 24
def shifted(model: onnx.ModelProto, classes: int, to_class: int) -> onnx.ModelProto:
    """Every row answered with certainty for one class (`to_class`): a distribution the champion never gives."""
    constant = np.zeros(classes, np.float32)
    constant[to_class] = 1.0
    return through(model, [helper.make_node("Mul", ["inner", "zero"], ["cleared"]),
                           helper.make_node("Add", ["cleared", "certain"], ["probabilities"])],
                   [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                    numpy_helper.from_array(constant, "certain")])


def confused(model: onnx.ModelProto, column: str, classes: int, share: float) -> onnx.ModelProto:
    """The same network, but on about `share` of the rows (those whose numeric `column`, times 1000, has a
    fractional part below `share`: a fixed, input-decided subset; missing values never) its probabilities moved on
    by one class, so it answers another class there: worse than its own network by construction, while the mix of
    classes it predicts barely moves (a shifted mix would trip the canary's PSI check first)."""
    rotation = np.roll(np.arange(classes, dtype=np.int64), -1)
    return through(model, [
        helper.make_node("Cast", [column], ["as_double"], to=onnx.TensorProto.DOUBLE),
        helper.make_node("Reshape", ["as_double", "column_shape"], ["value"]),
        helper.make_node("Mul", ["value", "thousand"], ["scaled"]),
        helper.make_node("Floor", ["scaled"], ["whole"]),
        helper.make_node("Sub", ["scaled", "whole"], ["fraction"]),
        helper.make_node("Less", ["fraction", "share"], ["chosen"]),
        helper.make_node("Gather", ["inner", "rotation"], ["rotated"], axis=1),
        helper.make_node("Where", ["chosen", "rotated", "inner"], ["probabilities"])],
        [numpy_helper.from_array(np.array([-1, 1], np.int64), "column_shape"),
         numpy_helper.from_array(np.array(1000.0), "thousand"), numpy_helper.from_array(np.array(share), "share"),
         numpy_helper.from_array(rotation, "rotation")])


def least_predicted_class(url: str, features: pd.DataFrame) -> tuple[int, int]:
    """(number of classes, index of the class the champion predicts least often on 50 holdout rows)."""
    rows = features.head(50).astype(object).where(features.head(50).notna(), None).to_dict(orient="records")
    answer = httpx.post(f"{url}/predict", json={"rows": rows}).json()
    classes = list(answer["predictions"][0]["probabilities"])
    counts = [sum(p["label"] == name for p in answer["predictions"]) for name in classes]
    return len(classes), int(np.argmin(counts))


def register_challenger(client, model: onnx.ModelProto, folder: Path, alias: str | None = CHALLENGER) -> str:
    """A new version holding `model` as model.onnx (the folder is its artifact), tagged with its sha256 as register
    does (the service verifies it), and made `alias` (None: no alias). In this process: a registering interpreter
    of its own costs ~15 s on a busy box."""
    payload = model.SerializeToString()
    folder.mkdir(exist_ok=True)
    (folder / "model.onnx").write_bytes(payload)
    version = client.create_model_version(MODEL, source=str(folder)).version
    client.set_model_version_tag(MODEL, version, "artifact_sha256", hashlib.sha256(payload).hexdigest())
    if alias is not None:
        client.set_registered_model_alias(MODEL, alias, version)
    return str(version)


def served_champion(url: str, version: str, timeout: float = 30.0) -> bool:
    """Whether the service at `url` answers with `version` as champion within `timeout` (it polls the registry)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if str(httpx.get(f"{url}/health").json()["champion"]) == version:
            return True
        time.sleep(0.1)
    return False


def bless_quality(client, project, candidate: Path, params) -> Blessing:
    """bless's quality stage on the real files: `candidate` against the live champion (downloaded from the
    registry) on the same holdout rows, with the paired bootstrap interval. The performance and service stages
    time and load the candidate; they do not judge quality, so they are left to their own tests."""
    schema = load_schema(project.root / "data/prepare/schema.json")
    with tempfile.TemporaryDirectory() as folder:
        champion = fetch_champion(client, MODEL, schema, Path(folder))
        predictions = holdout_predictions(candidate, schema, load_holdout(schema), champion, threads=1)
    quality = assess_quality(predictions, params.bless, champion.version)
    return Blessing(gate=quality.gate, outcome=quality.outcome, model_name=MODEL, candidate_path=str(candidate),
                    candidate_sha256=sha256_file(candidate), candidate_metrics=quality.details["candidate"],
                    champion_version=champion.version, champion_metrics=quality.details["champion"], stages=[quality])


def run_canary(project, service, params, traffic: bool = True):
    """The canary on the service at `service`, while LiveTraffic runs (`traffic`)."""
    features, truth = holdout(project)
    schema = load_schema(project.root / "data/prepare/schema.json")
    rows = pd.concat([features, truth.rename(schema.target)], axis=1)
    if not traffic:
        return canary.run_canary(params, rows, schema, service)
    with LiveTraffic(service.url, features, truth):
        return canary.run_canary(params, rows, schema, service)


@pytest.mark.parametrize("fault, reason", [("erroring", "error rate"), ("slow", "p95 latency"),
                                           ("shifted", "PSI of the predicted classes")])
def test_a_faulty_challenger_is_rolled_back_at_its_first_step_and_the_champion_is_unchanged(
        live, fault, reason, tmp_path, monkeypatch):
    project, service, params, client = live
    monkeypatch.chdir(project.root)   # the registry's artifact paths are relative to the project
    champion = client.get_model_version_by_alias(MODEL, CHAMPION).version
    model = champion_model(client)
    features = holdout(project)[0]
    most_often_set = features.select_dtypes("number").notna().mean().idxmax()
    faulty = {"erroring": lambda: erroring(model, most_often_set), "slow": lambda: slowed(model, SLOW_PRODUCTS),
              "shifted": lambda: shifted(model, *least_predicted_class(service.url, features))}[fault]()
    version = register_challenger(client, faulty, tmp_path)
    with cpu_hog() if fault == "slow" else contextlib.nullcontext():   # slower than the champion on a busy box too
        report = run_canary(project, service, params)
    # Latency is judged once the challenger answers (a shadow's time is not an answer's): from the first traffic step.
    first = "50%" if fault == "slow" else "shadow"
    assert [(s.phase, s.status) for s in report.steps][-1] == (first, "fail"), \
        "\n".join(f"{s.phase} {s.status}: {s.reasons}" for s in report.steps)   # a str: shown whole
    assert all(s.status == "pass" for s in report.steps[:-1])
    assert report.outcome is CanaryOutcome.ROLLED_BACK, report.action
    assert report.action.startswith(f"rolled back at step {first}: v{version} rejected"), report.action
    assert report.steps[-1].challenger.requests >= RULES.min_samples
    assert any(reason in r for r in report.steps[-1].reasons), report.steps[-1].reasons
    if fault == "slow":   # a latency failure stands only when fresh requests reproduce it, the box's load beside it
        assert any("the first measurement failed too" in r for r in report.steps[-1].reasons), report.steps[-1]
        assert report.steps[-1].statistics.load["cores"] >= 1
    assert client.get_model_version_by_alias(MODEL, CHAMPION).version == champion
    assert CHALLENGER not in client.get_registered_model(MODEL).aliases
    tags = client.get_model_version(MODEL, version).tags
    assert reason in tags["rejected"] and tags[f"canary.{first.replace('%', 'pct')}"].startswith("fail")
    assert httpx.get(f"{service.url}/health").json()["challenger_share"] == 0.0   # the traffic is back


def test_a_challenger_as_fast_as_the_champion_is_not_rolled_back_on_latency_beside_a_cpu_hog(
        live, tmp_path, monkeypatch):
    """The champion's own graph as challenger, the box kept busy throughout: whatever the hog does to a step's
    p95, it does to both variants, and a latency failure must reproduce on fresh requests before it stands."""
    project, service, params, client = live
    monkeypatch.chdir(project.root)
    version = register_challenger(client, champion_model(client), tmp_path)
    with cpu_hog():
        report = run_canary(project, service, params)
    assert report.outcome is CanaryOutcome.PROMOTED, [(s.phase, s.status, s.reasons) for s in report.steps]
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION).version) == version


def test_a_challenger_bless_measured_better_waits_for_approval_then_the_canary_promotes_it(
        live, tmp_path, monkeypatch):
    """What the canary is for: a retrained version better than the champion reaches all traffic. The champion
    serving is a worse copy of the trained network (a person put it there in the MLflow UI), the challenger is
    the network itself; promotion.approval is required, so nothing routes to it until a person approves."""
    project, service, params, client = live
    monkeypatch.chdir(project.root)
    network = champion_model(client)
    features = holdout(project)[0]
    column = features.select_dtypes("number").notna().mean().idxmax()
    classes = least_predicted_class(service.url, features)[0]
    start, old = len(read_history(client, MODEL)), str(client.get_model_version_by_alias(MODEL, CHAMPION).version)
    worse = register_challenger(client, confused(onnx.ModelProto.FromString(network.SerializeToString()), column,
                                                 classes, share=0.3), tmp_path / "worse", alias=None)
    client.set_registered_model_alias(MODEL, CHAMPION, worse)          # a hand move, as the MLflow UI makes it
    assert served_champion(service.url, worse), httpx.get(f"{service.url}/health").json()

    better = register_challenger(client, network, tmp_path / "better", alias=None)
    client.set_model_version_tag(MODEL, better, "parent_version", worse)   # what bless judged it against
    blessing = bless_quality(client, project, tmp_path / "better" / "model.onnx", params)
    assert blessing.outcome is BlessOutcome.BETTER, blessing.stages[0].headline
    outcome, action = apply_aliases(client, MODEL, better, blessing, "pipeline run (test)", approval=True)
    assert outcome is RegistrationOutcome.AWAITING_APPROVAL, action
    assert CHALLENGER not in client.get_registered_model(MODEL).aliases                 # no traffic reaches it
    assert httpx.get(f"{service.url}/health").json()["challenger"] is None

    approved = decide(client, MODEL, better, "approved", "reviewer", "torchship approve (test)",
                      "bless measured it better", params.promotion.approval_timeout_s)
    assert approved.canary_due, approved.action
    report = run_canary(project, service, params)
    assert [(s.phase, s.status) for s in report.steps] == [("shadow", "pass"), ("50%", "pass"), ("100%", "pass")], \
        [s.reasons for s in report.steps]
    assert report.outcome is CanaryOutcome.PROMOTED, report.action
    assert report.action == f"promoted v{better} to champion (v{worse} tagged previous)"
    assert all(s.challenger.requests >= RULES.min_samples for s in report.steps)
    # feedback is joined where it landed in time (the log is flushed every serve.log_flush_seconds, and a step may be
    # judged sooner): in some step both variants have labelled rows and their accuracies are compared
    assert any(s.champion.labelled and s.challenger.labelled and "accuracy" in s.reasons[0] for s in report.steps), \
        [s.reasons for s in report.steps]
    assert served_champion(service.url, better), httpx.get(f"{service.url}/health").json()
    assert "previous" in client.get_model_version(MODEL, worse).tags
    assert {f"canary.{p}" for p in ("shadow", "50pct", "100pct")} <= set(client.get_model_version(MODEL, better).tags)
    history = read_history(client, MODEL)[start:]
    assert history[0].actor.startswith("outside torchship"), history[0]   # the hand move, noticed and recorded
    entries = [(e.kind, e.alias, e.from_version, e.to_version) for e in history]
    assert entries[:4] == [("move", CHAMPION, old, worse), ("approval", None, None, better),
                           ("approval", None, None, better), ("move", CHALLENGER, None, better)], entries
    assert sorted(entries[4:]) == [("move", CHALLENGER, better, None), ("move", CHAMPION, worse, better)], entries


def test_a_candidate_with_another_input_signature_is_not_canaried(live, tmp_path, monkeypatch):
    project, service, params, client = live
    monkeypatch.chdir(project.root)
    champion = client.get_model_version_by_alias(MODEL, CHAMPION).version
    model = champion_model(client)
    entry = next(e for e in model.metadata_props if e.key == "torchship.schema")
    schema = json.loads(entry.value)
    schema["features"][0]["name"] += " (renamed)"   # what a new table's candidate would carry
    entry.value = json.dumps(schema)
    version = register_challenger(client, model, tmp_path)
    report = run_canary(project, service, params, traffic=False)
    assert report.outcome is CanaryOutcome.NOT_COMPARABLE, report.action
    assert report.action.startswith(f"not run: v{version}'s input signature differs from champion v{champion}'s")
    assert report.gate.status == "fail" and report.steps == []
    aliases = {alias: str(v) for alias, v in client.get_registered_model(MODEL).aliases.items()}
    assert aliases == {CHAMPION: str(champion), CHALLENGER: version}   # nothing moved
    client.delete_registered_model_alias(MODEL, CHALLENGER)


def test_a_step_without_enough_traffic_ends_the_canary_inconclusive(live, tmp_path, monkeypatch):
    project, service, params, client = live
    monkeypatch.chdir(project.root)
    version = register_challenger(client, champion_model(client), tmp_path)
    quiet = params.model_copy(update={"canary": RULES.model_copy(update={"step_max_s": 1.0})})
    report = run_canary(project, service, quiet, traffic=False)
    assert [(s.phase, s.status) for s in report.steps] == [("shadow", "short")]   # no client sent anything
    assert report.outcome is CanaryOutcome.INCONCLUSIVE and report.gate.status == "warn", report.action
    assert report.action.startswith("inconclusive at step shadow")
    assert "0 of the 20 requests" in report.steps[0].reasons[0]
    assert str(client.get_registered_model(MODEL).aliases[CHALLENGER]) == version   # not rejected: no evidence
    assert "canary_inconclusive" in client.get_model_version(MODEL, version).tags
    assert httpx.get(f"{service.url}/health").json()["challenger_share"] == 0.0
    client.delete_registered_model_alias(MODEL, CHALLENGER)
