"""The accepted-batch index: which labelled batches the model trains on, as DVC's snapshot of data/batches/
(`data/batches.dvc`: the folder's md5, file count and size). In the embedded default it is that file in the one
working tree. On the team topology (a registry every machine reaches, `registry_lock.lock_kind` SERVER) a batch a
retrain accepted on one worker must reach the next run on another, which never commits and never saw that tree:
the snapshot is then also a tag of the registered model on the tracking server (`torchship.batches`), moved under
the model's registry lock, and the batches themselves are in the DVC remote.

- `publish_batch`: under the lock, first take the shared snapshot (another worker may have moved it since this run
  started), then store the new batch beside it, snapshot the folder, push it to the remote, and only then move the
  tag: the index never names data the remote lacks, and two workers accepting at once both land (no lost update).
- `pull_batches`: before a run, make data/batches/ what the index names (`dvc pull` of that snapshot)."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from tasks.core import paths
from tasks.core.params_spec import TrackingParams
from tasks.registry.lock import SERVER, alias_lock, lock_kind
from tasks.registry.read import cannot_answer
from tasks.stages.repro import run_dvc

INDEX_TAG = "torchship.batches"
SNAPSHOT_KEYS = ("md5", "size", "nfiles", "hash", "path")   # what `dvc add` writes about a folder, nothing else
DVC_TIMEOUT_S = 600


def is_shared(tracking: TrackingParams) -> bool:
    """True when the registry is one every machine reaches: the index then lives there, not only in this tree."""
    return lock_kind(tracking.resolved_uri()) == SERVER


def snapshot_of(dvc_file_text: str) -> dict | None:
    """The folder's entry of a `.dvc` file (None for an empty or foreign file)."""
    outs = (yaml.safe_load(dvc_file_text) or {}).get("outs") or [{}]
    snapshot = {key: outs[0][key] for key in SNAPSHOT_KEYS if key in outs[0]}
    return snapshot if snapshot.get("md5") else None


def dvc_file_text(snapshot: dict) -> str:
    """The `.dvc` file that restores `snapshot` (`dvc pull` / `dvc checkout` read it)."""
    return yaml.safe_dump({"outs": [snapshot]}, sort_keys=False)


def local_snapshot(root: Path = Path(".")) -> dict | None:
    dvc_file = root / paths.BATCHES_DVC
    return snapshot_of(dvc_file.read_text()) if dvc_file.exists() else None


def shared_snapshot(client, model: str) -> dict | None:
    """The index on the tracking server; None before the first accepted batch (or the first version)."""
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(model).tags
    except MlflowException as exc:
        if cannot_answer(exc):   # a store that cannot answer now is not "no index": the run would train without them
            raise
        return None
    return json.loads(tags[INDEX_TAG]) if INDEX_TAG in tags else None


def pull_batches(client, model: str, root: Path = Path(".")) -> str:
    """Make data/batches/ what the shared index names; returns what happened, in words."""
    shared = shared_snapshot(client, model)
    if shared is None:
        return "no accepted batches in the shared index"
    if shared["md5"] == (local_snapshot(root) or {}).get("md5") and (root / paths.BATCHES).is_dir():
        return f"accepted batches up to date ({shared.get('nfiles', '?')} file(s))"
    (root / paths.BATCHES_DVC).parent.mkdir(parents=True, exist_ok=True)
    (root / paths.BATCHES_DVC).write_text(dvc_file_text(shared))
    dvc(root, "pull", "--force", str(paths.BATCHES_DVC))   # --force: this tree's own batches yield to the index
    return f"pulled {shared.get('nfiles', '?')} accepted batch file(s) named by the shared index"


def pull_shared_batches(tracking: TrackingParams, model: str) -> str:
    """Before a run: on the team topology, data/batches/ as the shared index names it; in the embedded default the
    batches are this tree's already."""
    if not is_shared(tracking):
        return "accepted batches: this working tree's (embedded default)"
    from tasks.registry.read import registry_client

    return pull_batches(registry_client(tracking), model)


def keep_batch(tracking: TrackingParams, model: str, store: Callable[[], Path], snapshot: bool = True,
               root: Path = Path(".")) -> Path:
    """Store an accepted batch (`store` writes it under data/batches/): on the team topology into the shared index,
    so the next run on any worker trains on it; else in this tree, snapshotted with `dvc add` when `snapshot`."""
    if is_shared(tracking):
        from tasks.registry.read import registry_client

        return publish_batch(registry_client(tracking), model, store, root)
    accepted = store()
    if snapshot:
        snapshot_batches(root)
    return accepted


def publish_batch(client, model: str, store: Callable[[], Path], root: Path = Path(".")) -> Path:
    """Store a batch on top of the shared index and move the index to include it, as one step under the model's
    registry lock. `store` writes the batch under data/batches/ and returns its path."""
    with alias_lock(client, model):
        pull_batches(client, model, root)
        accepted = store()
        snapshot_batches(root)
        dvc(root, "push", str(paths.BATCHES_DVC))
        snapshot = local_snapshot(root)
        ensure_registered(client, model)
        client.set_registered_model_tag(model, INDEX_TAG, json.dumps(snapshot, sort_keys=True))
    return accepted


def ensure_registered(client, model: str) -> None:
    """A registered model to carry the tag (a batch may be ingested before the first version)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(model)
    except MlflowException:
        client.create_registered_model(model)


def snapshot_batches(root: Path = Path(".")) -> None:
    """`dvc add data/batches`: the accepted batches become a DVC-tracked snapshot (data/batches.dvc, cached),
    restorable with `dvc checkout` and pushed with `dvc push` like any DVC data."""
    dvc(root, "add", str(paths.BATCHES))


def dvc(root: Path, *args: str) -> None:
    run_dvc(root, *args, "--quiet", timeout=DVC_TIMEOUT_S)
