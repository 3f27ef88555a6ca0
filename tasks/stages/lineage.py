"""Where a model came from: git commit, DVC hashes of its data and params, so anyone can rebuild it."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from tasks.stages.repro import read_lock


def git_state(root: Path = Path(".")) -> dict[str, str]:
    """The commit and whether the tree had uncommitted changes (then the commit alone can't rebuild it)."""
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else ""

    commit = git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"git_commit": commit, "git_dirty": str(dirty).lower()}


def dvc_hashes(root: Path = Path(".")) -> dict[str, str]:
    """md5s DVC recorded for the training data and the train params (from dvc.lock)."""
    stages = read_lock(root)
    hashes = {}
    for out in stages.get("prepare", {}).get("outs", []):
        name = Path(out["path"]).stem
        hashes[f"dvc_{name}_md5"] = out.get("md5", "")
    for dep in stages.get("prepare", {}).get("deps", []):
        if dep["path"] == "data/source.json":   # the source's fingerprint, accepted batches included
            hashes["dvc_source_md5"] = dep.get("md5", "")
    train = stages.get("train", {})
    if train.get("params"):
        canonical = json.dumps(train["params"], sort_keys=True).encode()
        hashes["dvc_train_params_md5"] = hashlib.md5(canonical).hexdigest()
    for out in train.get("outs", []):
        if out["path"].endswith("model.pt"):
            hashes["dvc_weights_md5"] = out.get("md5", "")
    return hashes


def data_snapshot(root: Path = Path(".")) -> dict[str, str]:
    """Which accepted batches (e.g. a retrain's window) the training data held, and the DVC snapshot of them."""
    tags = {}
    fingerprint = root / "data" / "source.json"
    if fingerprint.exists():
        batches = sorted(json.loads(fingerprint.read_text()).get("batches", {}))
        tags["data_batches"] = (",".join(batches) or "none")[:4000]
    snapshot = root / "data" / "batches.dvc"
    if snapshot.exists():
        from ruamel.yaml import YAML

        outs = YAML(typ="safe").load(snapshot.read_text()).get("outs", [{}])
        tags["dvc_batches_md5"] = str(outs[0].get("md5", ""))
    return tags


def lineage_tags(root: Path = Path(".")) -> dict[str, str]:
    return {**git_state(root), **dvc_hashes(root), **data_snapshot(root)}
