"""The lineage round-trip: what a version records so it can be rebuilt, and `torchship rebuild VERSION`.

The pipeline never commits, and `--set` or a retrain leaves the tree dirty, so a commit alone does not
describe a model. register therefore logs the exact params.yaml and dvc.lock (and the source fingerprint
and batch snapshot) as artifacts of the version's run and pushes the data to the DVC remote. A rebuild checks
the recorded commit out into a temporary workspace, restores those files, `dvc pull`s the data the lock names,
re-runs every stage after prepare forced (never from DVC's run cache) and compares the rebuilt model's
holdout metrics with the registered ones.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from tasks.core.artifacts import read_json
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params
from tasks.registry.read import inside, model_version, refuse_climbing, registry_client
from tasks.stages.repro import StageOutcome, reproduce, run_dvc, stage_environment
from tasks.stages.stage_list import dvc_stages

LINEAGE = "lineage"   # artifact folder of the version's run
LINEAGE_FILES = ("params.yaml", "dvc.lock", "data/source.json", "data/batches.dvc")
# prepare's outputs come from the DVC remote (the recorded data, md5-checked); every stage after it is rebuilt.
PULLED = "prepare"
METRICS = ("accuracy", "f1_macro")
METRIC_TAG = "holdout_{}"


def log_lineage(root: Path = Path(".")) -> list[str]:
    """Inside the register run: the files that, with the commit, pin the model. Returns what was logged."""
    import mlflow

    logged = []
    for name in LINEAGE_FILES:
        if (root / name).exists():
            mlflow.log_artifact(str(root / name), artifact_path=str(Path(LINEAGE) / Path(name).parent))
            logged.append(name)
    return logged


def push_data(root: Path = Path(".")) -> str:
    """`dvc push` of every cached output and snapshot to the default remote; returns what happened, in words
    (a failed push is recorded on the version, not fatal: the model is still registered and served)."""
    result = subprocess.run([sys.executable, "-m", "dvc", "push", "--quiet"], cwd=root, capture_output=True,
                            text=True, env=stage_environment())
    if result.returncode != 0:
        return f"failed: {(result.stderr.strip().splitlines() or ['dvc push failed'])[-1][:300]}"
    return "pushed to the DVC remote"


class RebuildReport(BaseModel):
    model_name: str
    version: str
    commit: str
    workspace: str
    registered: dict[str, float]
    rebuilt: dict[str, float]
    tolerance: float
    matched: bool
    stages: list[StageOutcome]
    seconds: float


def pull_champion_splits(params: Params, root: Path = Path(".")) -> str | None:
    """A worker's fresh clone (the team topology) has no data/prepare/: the monitor's reference and the retrain's
    batch gate need the champion's splits and schema. They come from the DVC remote, by the dvc.lock the champion's
    version recorded (register pushed them); the tree's own dvc.lock is put back. None when they are here."""
    from tasks.core import paths
    from tasks.registry.read import CHAMPION, alias_version

    wanted = (paths.TRAIN_SPLIT, paths.HOLDOUT_SPLIT, paths.SCHEMA)
    if all((root / path).exists() for path in wanted):
        return None
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    champion = alias_version(client, name, CHAMPION)
    if champion is None or not champion.run_id:
        raise TorchshipError(f"no prepared data here ({paths.PREPARE}/) and no champion of {name} whose recorded "
                             "data could be pulled: run the pipeline first.")
    lock = root / "dvc.lock"
    kept = lock.read_bytes() if lock.exists() else None
    refuse_climbing(client.get_run(champion.run_id).info.artifact_uri, f"run {champion.run_id}")
    with tempfile.TemporaryDirectory() as folder:
        recorded = client.download_artifacts(champion.run_id, f"{LINEAGE}/dvc.lock", folder)
        shutil.copyfile(inside(Path(folder), Path(recorded), f"run {champion.run_id}"), lock)
    try:
        run_dvc(root, "pull", "--quiet", PULLED)
    finally:
        if kept is None:
            lock.unlink(missing_ok=True)
        else:
            lock.write_bytes(kept)
    return f"pulled champion v{champion.version}'s prepared data ({paths.PREPARE}/) from the DVC remote"


def rebuild_version(params: Params, version: str, tolerance: float = 0.01, keep: bool = False,
                    root: Path = Path("."), echo=sys.stdout) -> RebuildReport:
    """Recreate `version` from its recorded commit, params, lock and data; compare its metrics."""
    started = time.perf_counter()
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    found = model_version(client, name, version)
    commit = found.tags.get("git_commit", "")
    registered = {m: float(found.tags[METRIC_TAG.format(m)]) for m in METRICS if METRIC_TAG.format(m) in found.tags}
    if not commit or commit.startswith("unknown") or not registered or not found.run_id:
        raise TorchshipError(f"v{version} of {name} records no commit, metrics or run to rebuild from "
                             "(versions registered before lineage round-trips were added cannot be rebuilt).")
    workspace = Path(tempfile.mkdtemp(prefix=f"torchship-rebuild-{name}-v{version}-"))
    try:
        _checkout(root.resolve(), commit, workspace)
        restored = _restore_lineage(client, found.run_id, workspace)
        _point_remote_at(root.resolve(), workspace)
        echo.write(f"── rebuild v{version} ── commit {commit[:10]}, restored {', '.join(restored)}; "
                   "dvc pull of the prepared data\n")
        run_dvc(workspace, "pull", "--quiet", PULLED)
        stages = [reproduce(stage, echo=echo, cwd=workspace, force=True) for stage in rebuilt_stages(workspace)]
        profile = read_json(workspace / "data/profile/report.json")
        chosen = profile["variants"][profile["selected"]]
        rebuilt = {m: float(chosen[m]) for m in registered if m in chosen}
    finally:
        if not keep:
            shutil.rmtree(workspace, ignore_errors=True)
    matched = bool(rebuilt) and all(abs(rebuilt[m] - registered[m]) <= tolerance for m in rebuilt)
    return RebuildReport(model_name=name, version=str(version), commit=commit, workspace=str(workspace),
                         registered=registered, rebuilt=rebuilt, tolerance=tolerance, matched=matched, stages=stages,
                         seconds=time.perf_counter() - started)


def rebuilt_stages(workspace: Path) -> list[str]:
    """The stages after the pulled one, in the order of the checked-out commit's dvc.yaml."""
    stages = dvc_stages(workspace)
    return stages[stages.index(PULLED) + 1:]


def _checkout(root: Path, commit: str, workspace: Path) -> None:
    for command in (["git", "clone", "--quiet", "--no-checkout", str(root), str(workspace)],
                    ["git", "-C", str(workspace), "checkout", "--quiet", commit]):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise TorchshipError(f"cannot check out commit {commit[:10]} from {root}: {result.stderr.strip()} "
                                 "(was it pushed, or the history rewritten?)")


def _restore_lineage(client, run_id: str, workspace: Path) -> list[str]:
    """The version's params.yaml, dvc.lock, source fingerprint and batch snapshot over the checkout."""
    refuse_climbing(client.get_run(run_id).info.artifact_uri, f"run {run_id}")
    with tempfile.TemporaryDirectory() as folder:
        downloaded = inside(Path(folder), Path(client.download_artifacts(run_id, LINEAGE, folder)), f"run {run_id}")
        restored = []
        for name in LINEAGE_FILES:
            if (downloaded / name).exists():
                (workspace / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(downloaded / name, workspace / name)
                restored.append(name)
    if "dvc.lock" not in restored or "params.yaml" not in restored:
        raise TorchshipError(f"run {run_id} holds no {LINEAGE}/params.yaml and dvc.lock: nothing pins this version.")
    _track_locally(workspace / "params.yaml")
    return restored


def _track_locally(params_file: Path) -> None:
    """The rebuild's stages log to a tracking store inside the workspace, never to the project's registry
    (`tracking` is no stage's DVC param, so the lock still matches)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    document = yaml.load(params_file.read_text())
    document["tracking"] = {**(document.get("tracking") or {}), "uri": "sqlite:///mlflow/mlflow.db",
                            "artifacts": "mlflow/artifacts"}
    with params_file.open("w") as handle:
        yaml.dump(document, handle)


def _point_remote_at(root: Path, workspace: Path) -> None:
    """The checkout's default remote, as the project resolves it (a relative URL would point inside the
    temporary workspace)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        remote = repo.config["core"].get("remote")
        url = repo.config["remote"][remote]["url"] if remote else None
    if not remote or not url:
        raise TorchshipError("no default DVC remote is configured: "
                             "`dvc remote add -d NAME URL` and re-run the pipeline.")
    run_dvc(workspace, "remote", "modify", "--local", remote, "url", str(url))


