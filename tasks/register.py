"""register: log the selected ONNX variant to the MLflow registry with lineage and set aliases (Prefect-only)."""
from __future__ import annotations

import contextlib
import logging
import os
import time
from importlib.metadata import version as installed_version
from pathlib import Path

from tasks.core import paths
from tasks.core.artifacts import read_json
from tasks.core.env import HTTP_RETRIES_ENV, MLFLOW_HTTP_RETRY, http_retry_window_s, kept
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params
from tasks.core.schema_spec import load_schema
from tasks.core.verdicts import OUTCOME_TAG, Blessing, Registration, RegistrationOutcome
from tasks.modalities import load_holdout, modality_of
from tasks.registry.approvals import REQUESTED_TAG, announce_waiting, request_approval
from tasks.registry.history import run_actor
from tasks.registry.model_card import model_card_html, model_card_markdown
from tasks.registry.read import (
    CHALLENGER,
    CHAMPION,
    SHA_TAG,
    UNFINISHED_TAG,
    alias_version,
    aliases,
    find_version_by_sha,
    registry_client,
    server_unreachable,
    store_busy,
)
from tasks.registry.write import promote, recorded_move, reject
from tasks.stages.lineage import lineage_tags
from tasks.stages.rebuild import METRIC_TAG, METRICS, log_lineage, push_data

log = logging.getLogger("torchship.register")
# Waits between attempts when the store is busy (each attempt itself waits up to MLflow's 20 s SQLite busy
# timeout): about 2 minutes in all before the step fails with StoreBusy.
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0)


class StoreBusy(TorchshipError):
    """The MLflow store stayed locked through every retry of the register step."""


class TrackingServerDown(TorchshipError):
    """The tracking server did not answer through MLflow's client retries (MLFLOW_HTTP_RETRY) during register."""



# What the registered ONNX model needs to load (MLflow's onnx flavor), pinned to this environment. Named here, MLflow
# skips inferring them, which loads the model in a fresh interpreter (~2 CPU-s a registration) to list these same five.
SERVED_PACKAGES = ("mlflow", "numpy", "onnx", "onnxruntime", "pandas")


def served_requirements() -> list[str]:
    return [f"{package}=={installed_version(package)}" for package in SERVED_PACKAGES]


def register_candidate(params: Params, blessing: Blessing, run_id: str | None = None,
                       trigger: dict[str, str] | None = None) -> Registration:
    """Register (or reuse, for identical bytes) the candidate and apply the registry protocol."""
    import mlflow
    import onnx

    started = time.perf_counter()
    client = registry_client(params.tracking)
    name = blessing.model_name
    existing = find_version_by_sha(client, name, blessing.candidate_sha256)
    if existing is not None and UNFINISHED_TAG not in existing.tags:
        return Registration(model_name=name, version=str(existing.version), created=False,
                            outcome=RegistrationOutcome.REUSED,
                            action=f"same bytes as v{existing.version}: no new version, aliases unchanged",
                            aliases=aliases(client, name), seconds=time.perf_counter() - started)
    schema = load_schema(paths.SCHEMA)
    # the served graph's own raw inputs: what `mlflow models serve` and its pyfunc are fed
    example, signature = modality_of(schema).signature(schema, Path(blessing.candidate_path), load_holdout(schema))
    profile = read_json(paths.PROFILE_REPORT)
    tags = {**lineage_tags(Path(".")), SHA_TAG: blessing.candidate_sha256, "variant": profile["selected"],
            "bless": blessing.gate.status, OUTCOME_TAG: str(blessing.outcome),
            "bless_reasons": "; ".join(blessing.gate.reasons)[:4000], "data_source": params.data.source}
    if blessing.champion_version:
        tags["parent_version"] = blessing.champion_version
    if run_id:
        tags["pipeline_run"] = run_id
    tags.update(trigger or {})
    held: dict[str, str] = {}   # the tags the version was created with (none: an attempt left it unfinished)
    if existing is not None:   # registered by an attempt that stopped (a busy store, a killed run): finish it
        version = str(existing.version)
        log.info("register: finishing v%s, registered from these bytes by an attempt that did not complete", version)
    else:
        # Artifacts first, then the version with its sha tag in one write: a version never exists without its
        # artifacts or its tag, so a retry or a re-run finds it (find_version_by_sha) instead of adding another.
        info = mlflow.onnx.log_model(onnx.load(blessing.candidate_path), name="model",
                                     signature=signature, input_example=example,
                                     onnx_execution_providers=["CPUExecutionProvider"],
                                     pip_requirements=served_requirements(),
                                     save_as_external_data=False)   # one file, byte-identical to the candidate
        pending = {**tags, UNFINISHED_TAG: "artifacts logged; tags, model card and aliases not yet written"}
        version = str(mlflow.register_model(info.model_uri, name, tags=pending).version)
        version = drop_duplicates(client, name, blessing.candidate_sha256, version)
        held = pending
    # The commit alone does not pin a model (`--set`, a retrain): the exact params and lock, and the data pushed.
    tags["lineage_files"] = ", ".join(log_lineage(Path(".")))
    tags["dvc_push"] = push_data(Path("."))
    tags.update({METRIC_TAG.format(m): str(blessing.candidate_metrics[m]) for m in METRICS
                 if m in blessing.candidate_metrics})
    # Only what the version does not hold yet: on a tracking server each tag is two round trips (MLflow checks the
    # name is no prompt first), each with basic auth's password hash (about 0.5 s a request on a busy 2-core box).
    # A version an attempt left unfinished gets every tag again: that attempt may have had other values.
    for key, value in tags.items():
        if held.get(key) != value:
            client.set_model_version_tag(name, version, key, value)
    description = model_card_markdown(params, blessing, tags, version)
    mlflow.log_text(description, "model_card.md")
    mlflow.log_text(model_card_html(description), "model_card.html")
    run_kind = "retrain" if (trigger or {}).get("trigger") == "retrain" else "pipeline"
    active = mlflow.active_run()
    proof = (f"bless {blessing.gate.status} ({blessing.outcome}); model card: runs:/"
             f"{active.info.run_id if active else '?'}/model_card.md; v{version} tag bless_reasons")
    outcome, action = apply_aliases(client, name, version, blessing, run_actor(run_kind), proof,
                                    params.promotion.approval == "required")
    if outcome is RegistrationOutcome.AWAITING_APPROVAL:
        announce_waiting(params, client, name, version)   # after the lock: the notice takes it itself
    client.update_model_version(name, version, description=description)
    client.delete_model_version_tag(name, version, UNFINISHED_TAG)   # last: the version is complete
    return Registration(model_name=name, version=version, created=True, outcome=outcome, action=action,
                        aliases=aliases(client, name), seconds=time.perf_counter() - started)


def settle_duplicates(versions: list[tuple[str, dict[str, str], list[str]]], sha256: str
                      ) -> tuple[str | None, list[str]]:
    """Of the versions (number, tags, aliases) registered from these bytes: the one to keep (the oldest) and the
    unfinished ones beside it that hold no alias, to delete. MLflow's client retries a create whose answer was lost
    (a server restarted or cut off after it wrote the version): that retry makes a second version of the same bytes,
    which nobody has seen finished or served."""
    same = sorted((int(number), tags, held) for number, tags, held in versions if tags.get(SHA_TAG) == sha256)
    if not same:
        return None, []
    return str(same[0][0]), [str(number) for number, tags, held in same[1:] if UNFINISHED_TAG in tags and not held]


def drop_duplicates(client, name: str, sha256: str, created: str) -> str:
    """The version to finish after a create: `created`, or the older one a lost answer's retry duplicated (the
    surplus deleted, so exactly one version holds these bytes). Only this run's versions: another pipeline that
    registers the same bytes at the same moment is finishing its own, and must not find it deleted."""
    run_id = client.get_model_version(name, created).run_id
    found = [v for v in client.search_model_versions(f"name='{name}'") if v.run_id == run_id]
    keep, surplus = settle_duplicates([(str(v.version), v.tags, list(v.aliases or [])) for v in found], sha256)
    for number in surplus:
        log.warning("register: v%s duplicates v%s (MLflow's client retried a create whose answer was lost): "
                    "deleted", number, keep)
        client.delete_model_version(name, number)
    return keep or created


def apply_aliases(client, name: str, version: str, blessing: Blessing, actor: str | None = None,
                  evidence: str = "", approval: bool = False) -> tuple[RegistrationOutcome, str]:
    """Not blessed -> tagged rejected (a first model too: never a champion worse than the baselines);
    no champion yet -> champion; else challenger (the canary decides), or, with `approval` (promotion.approval
    required), no alias but `awaiting approval` (tasks/registry/approvals.py). Under the registry's alias lock, and
    only if the aliases are still what bless judged against: when another pipeline moved them meanwhile, this
    version keeps no alias and says so (no lost update). Each move goes in the alias history as `actor`'s
    (default: a pipeline run). Returns what happened, typed and in words."""
    held = sorted(alias for alias, holder in aliases(client, name).items() if holder == str(version))
    if held:   # an attempt that stopped after moving the aliases: nothing left to move
        holds = RegistrationOutcome.CHAMPION if CHAMPION in held else RegistrationOutcome.CHALLENGER
        return holds, f"v{version} already holds {', '.join(held)}"
    if REQUESTED_TAG in client.get_model_version(name, version).tags:   # asked by an attempt that stopped
        return RegistrationOutcome.AWAITING_APPROVAL, f"v{version} awaits approval (asked already)"
    if blessing.gate.status == "fail":
        reject(client, name, version, "bless: " + "; ".join(blessing.gate.reasons))
        return RegistrationOutcome.REJECTED, f"v{version} rejected by bless: {'; '.join(blessing.gate.reasons)}"
    with recorded_move(client, name, actor or run_actor("pipeline"), evidence=evidence) as move:
        moved = moved_since_bless(client, name, version, blessing)
        if moved:
            client.set_model_version_tag(name, version, "stale", moved)
            return RegistrationOutcome.STALE, f"v{version} registered without an alias: {moved}"
        if alias_version(client, name, CHAMPION) is None:
            move.reason = "register: first model of this name, blessed"
            promote(client, name, version, "first model of this name")
            return RegistrationOutcome.CHAMPION, f"v{version} is champion (first model)"
        if approval:
            return RegistrationOutcome.AWAITING_APPROVAL, request_approval(client, name, version, move.actor, evidence)
        move.reason = "register: blessed against the champion; the canary decides"
        client.set_registered_model_alias(name, CHALLENGER, version)
    return RegistrationOutcome.CHALLENGER, f"v{version} is challenger; the canary decides"


def moved_since_bless(client, name: str, version: str, blessing: Blessing) -> str | None:
    """Why this version must not take an alias now: the champion is not the one bless compared it with, or
    another version holds `challenger` (its canary is running, or was interrupted). None when all is as judged."""
    champion = alias_version(client, name, CHAMPION)
    now = str(champion.version) if champion else None
    if now != blessing.champion_version:
        judged = f"v{blessing.champion_version}" if blessing.champion_version else "no champion"
        return (f"the champion moved to v{now} while this run was blessing against {judged} (another pipeline "
                f"registered at the same time); re-run `torchship run` to judge v{version}'s model against v{now}")
    challenger = alias_version(client, name, CHALLENGER)
    if challenger is not None and str(challenger.version) != str(version):
        return (f"v{challenger.version} holds `challenger` (another pipeline's canary is running, or was "
                f"interrupted); re-run `torchship run` when it has ended, or "
                f"`torchship promote {version} --reason ...`")
    return None


def run(params: Params, blessing: Blessing, parent_run: str | None = None,
        trigger: dict[str, str] | None = None) -> Registration:
    """The step: register under a nested MLflow run (the model is logged from it); `trigger` tags a new
    version with why its pipeline ran (a retrain names its window's batch). A busy store (its SQLite database locked by
    another process) is retried with backoff; every attempt resumes what the previous one left."""
    with quiet_busy_store():
        return _run_with_retries(params, blessing, parent_run, trigger)


@contextlib.contextmanager
def quiet_busy_store():
    """MLflow logs each locked-database error with a full traceback before it raises; the retry's own warning says
    it in one line, so those records are dropped while the step runs (any other error is logged as before)."""
    store_log = logging.getLogger("mlflow.store.db.utils")
    busy = logging.Filter()
    busy.filter = lambda record: "database is locked" not in record.getMessage()
    store_log.addFilter(busy)
    try:
        yield
    finally:
        store_log.removeFilter(busy)


def _run_with_retries(params: Params, blessing: Blessing, parent_run: str | None,
                      trigger: dict[str, str] | None) -> Registration:
    import mlflow

    from tasks.core.tracking import stage_run

    started = time.monotonic()
    for attempt, delay in enumerate((*RETRY_DELAYS_S, None), start=1):
        try:
            with kept(HTTP_RETRIES_ENV):   # one_try_once_unreachable may lower MLflow's retries
                try:
                    with stage_run(params.tracking, "register", parent_run), one_try_once_unreachable():
                        registration = register_candidate(params, blessing, parent_run, trigger)
                    break
                except Exception as exc:
                    if mlflow.active_run() is not None and (store_busy(exc) or server_unreachable(exc)):
                        with contextlib.suppress(Exception):   # not ended when the store refused its start's writes
                            mlflow.end_run("FAILED")
                    raise
        except Exception as exc:   # the store's first contact may raise SQLAlchemy's own OperationalError
            if server_unreachable(exc) and not store_busy(exc):
                raise server_down(params, time.monotonic() - started, exc) from None
            if not store_busy(exc):
                raise
            if delay is None:
                raise StoreBusy(
                    f"register: the MLflow store {params.tracking.resolved_uri()} stayed busy through {attempt} "
                    f"attempts over {time.monotonic() - started:.0f} s ({str(exc).splitlines()[0][:200]}). "
                    "Another process holds its database (an `mlflow ui`, a second pipeline, a backup?): let it "
                    "finish, then re-run `torchship run`; a version registered meanwhile is finished, not "
                    "registered twice.") from None
            log.warning("register: the MLflow store is busy (%s); attempt %d again in %.1f s",
                        str(exc).splitlines()[0][:120], attempt + 1, delay)
            time.sleep(delay)
    log.info("register: %s", registration.action)
    return registration


@contextlib.contextmanager
def one_try_once_unreachable():
    """Once a request found the tracking server away through all its retries, the closing writes of the blocks
    around this one (end_run) try once each: retrying them too would double the wait before the step says the
    server is down. Inside kept(HTTP_RETRIES_ENV), which puts the retries back."""
    try:
        yield
    except Exception as exc:
        if server_unreachable(exc):
            os.environ[HTTP_RETRIES_ENV] = "0"
        raise


def server_down(params: Params, waited_s: float, exc: BaseException) -> TrackingServerDown:
    """What to say when the tracking server stayed away longer than MLflow's client retries each request."""
    window = http_retry_window_s({key: os.environ.get(key, value) for key, value in MLFLOW_HTTP_RETRY.items()})
    return TrackingServerDown(
        f"register: the MLflow tracking server {params.tracking.resolved_uri()} did not answer for "
        f"{window:.0f} s, MLflow's client retrying the request all along (the step had run "
        f"{waited_s:.0f} s; {str(exc).splitlines()[0][:300]}). Is it down or restarting? Check it (`torchship stack "
        f"status` on a loopback stack, else its host and log). Once it answers, run the pipeline again (`torchship "
        f"run`, or the deployment): a version this step registered keeps its `{UNFINISHED_TAG}` tag until then (no "
        "alias; `torchship status` shows it), and the next run finishes that version rather than adding another.")
