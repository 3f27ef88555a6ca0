"""The kill ladder: `torchship run` (a real process, with its DVC, torchrun and Prefect children) is SIGKILLed during
each step in turn, in one project: each re-run of the same command is killed one step later, so the ladder costs
about one pipeline run plus the restarts. A kill lands while the step writes: when its first output appears (for
train: its first checkpoint), the moment the outputs are on disk and dvc.lock does not vouch for them yet. The
whole process tree is killed at once, as a supervisor (systemd, docker, Kubernetes) kills a cgroup.

After every kill: each file a finished stage recorded in dvc.lock hashes to its recorded md5, no temp file is
inside an output DVC recorded, and every checkpoint the manifest lists hashes to its recorded sha256. Each re-run
skips the stages that finished (DVC) and the epochs that finished (the checkpoint), and the last run completes
with a champion whose artifact is the one register hashed."""
from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from ruamel.yaml import YAML

from tasks.stages.stage_list import pipeline_stages
from tests.conftest import BIN, REPO, Project, make_project
from tests.helpers import dvc_clean

pytestmark = pytest.mark.reliability
DVC_STAGES = tuple(pipeline_stages(REPO))
# A few more epochs than the session's tiny run, so train can be killed between two of them; no distilled student
# (a second torchrun job in compress: the same engine train's rung already kills).
LADDER = {"train": {"epochs": 4, "checkpoint_every": 0}, "distill": {"enabled": False}}
MODEL = "synthetic-churn"


def first_outputs(root: Path) -> dict[str, list[Path]]:
    """Per DVC stage, the outputs and metrics dvc.yaml declares (any of them appearing = the stage is writing)."""
    stages = YAML(typ="safe").load((root / "dvc.yaml").read_text())["stages"]
    found = {}
    for stage, spec in stages.items():
        names = [next(iter(o)) if isinstance(o, dict) else o for key in ("outs", "metrics") for o in spec.get(key, [])]
        found[stage] = [root / n for n in names]
    found["train"] = [root / "data/train/checkpoints/manifest.json"]   # killed mid-training, not at its end
    return found


def kill_tree(process: subprocess.Popen) -> None:
    """SIGSTOP the tree top-down (nobody spawns or reaps any more), then SIGKILL every process in it."""
    tree = [psutil.Process(process.pid)]
    for _ in range(3):   # children started while we stopped their parents
        for proc in tree:
            try:
                proc.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                pass
        seen = {p.pid for p in tree}
        for proc in list(tree):
            try:
                tree += [c for c in proc.children(recursive=True) if c.pid not in seen and not seen.add(c.pid)]
            except psutil.NoSuchProcess:
                pass
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait(timeout=60)
    deadline = time.monotonic() + 30   # gone, or a zombie nobody reaps yet (killed: it runs no more code either)
    while any(alive(proc) for proc in tree) and time.monotonic() < deadline:
        time.sleep(0.05)


def alive(proc) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_until(project: Project, done: callable, log: Path) -> tuple[str, int | None]:
    """`torchship run`, SIGKILLed (its whole tree) once `done()` is true; returns (output, exit code or None if
    killed). Bounded: a run that outlives 600 s fails the test."""
    with log.open("w") as handle:
        process = subprocess.Popen([str(BIN / "torchship"), "run"], cwd=project.root, env=project.env(),
                                   stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline, killed = time.monotonic() + 600, False
    while process.poll() is None:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        if done():
            kill_tree(process)
            killed = True
            break
        time.sleep(0.05)
    return log.read_text(), None if killed else process.returncode


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def assert_lock_trustworthy(root: Path) -> list[str]:
    """Every output a stage recorded in dvc.lock is on disk as recorded (a directory: each file of its cached
    manifest); no temp file inside a recorded output; every listed checkpoint intact. Returns the stages recorded."""
    lock = (YAML(typ="safe").load((root / "dvc.lock").read_text()) or {}).get("stages", {}) \
        if (root / "dvc.lock").exists() else {}
    for stage, entry in lock.items():
        for out in entry.get("outs", []):
            path = root / out["path"]
            if out["md5"].endswith(".dir"):
                cached = root / ".dvc/cache/files/md5" / out["md5"][:2] / out["md5"][2:]
                if not cached.exists():   # cache: false (checkpoints): their own manifest vouches, below
                    continue
                for item in json.loads(cached.read_text()):
                    assert md5(path / item["relpath"]) == item["md5"], f"{stage}: {path / item['relpath']} changed"
                temps = [p.name for p in path.rglob("*.tmp-*")]
                assert not temps, f"{stage}: temp files inside a recorded output: {temps}"
            else:
                assert md5(path) == out["md5"], f"{stage}: {out['path']} does not hash to its dvc.lock md5"
    for folder in ("data/train/checkpoints", "data/compress/checkpoints"):
        manifest = root / folder / "manifest.json"
        if manifest.exists():
            for entry in json.loads(manifest.read_text())["checkpoints"]:
                digest = hashlib.sha256((root / folder / entry["file"]).read_bytes()).hexdigest()
                assert digest == entry["sha256"], f"{folder}/{entry['file']} does not match its manifest"
    return [stage for stage in lock if stage in DVC_STAGES]   # `source` always runs (dvc.yaml): not a rung


def registered_versions(root: Path) -> int:
    import sqlite3

    db = root / "mlflow/mlflow.db"
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.2) as connection:
        try:
            return connection.execute("select count(*) from model_versions").fetchone()[0]
        except sqlite3.Error:   # not created yet, or busy: try again at the next poll
            return 0


@pytest.mark.timeout(900)
def test_a_run_killed_in_each_step_resumes_where_it_stopped(tmp_path, prefect_server):
    project = make_project(tmp_path / "project", LADDER, prefect=prefect_server)
    outputs = first_outputs(project.root)
    outcomes = {}
    for rung, stage in enumerate(DVC_STAGES):
        started = time.time()

        def writing(stage=stage, started=started) -> bool:
            return any(p.exists() and p.stat().st_mtime >= started for p in outputs[stage])

        output, code = run_until(project, writing, tmp_path / f"rung-{rung}.log")
        assert code is None, f"the run ended (exit {code}) before {stage} wrote anything:\n{output[-3000:]}"
        recorded = assert_lock_trustworthy(project.root)
        assert stage not in recorded, f"{stage} was killed while writing, yet dvc.lock vouches for it"
        assert recorded == list(DVC_STAGES[:rung]), recorded   # the earlier ones finished on an earlier rung
        # what this rung re-ran: only the stage it was killed in, never one an earlier rung finished
        outcomes[stage] = [s for s in DVC_STAGES if f"── {s} ──" in output]
        assert outcomes[stage] == ([DVC_STAGES[rung - 1], stage] if rung else [stage]), output[-3000:]
        if stage == "train":   # killed after at least one epoch's checkpoint
            assert json.loads((project.root / "data/train/checkpoints/manifest.json").read_text())["checkpoints"]
    # register: killed once a version exists (its tags and aliases may not)
    output, code = run_until(project, lambda: registered_versions(project.root) > 0, tmp_path / "rung-register.log")
    assert code is None, output[-3000:]
    assert [s for s in DVC_STAGES if f"── {s} ──" in output] == ["profile"], output[-3000:]
    assert assert_lock_trustworthy(project.root) == list(DVC_STAGES)
    # the last run is not killed: it completes and the champion's artifact is the one register hashed
    final = project.torchship("run")
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert not [s for s in DVC_STAGES if f"── {s} ──" in final.stdout], final.stdout[-3000:]
    # the train run after the kill (the next rung's, killed later in export) went on from the checkpoint: it never
    # trained epoch 1 again, and trained to the last epoch
    resumed = (tmp_path / f"rung-{DVC_STAGES.index('train') + 1}.log").read_text(errors="replace")
    assert "epoch 1:" not in resumed and f"epoch {LADDER['train']['epochs']}:" in resumed, resumed[-2000:]
    registry = project.registry(MODEL)   # the version the killed register step created, finished: not a second one
    assert list(registry["versions"]) == ["1"] and registry["aliases"] == {"champion": "1"}, registry
    assert "artifact_sha256" in registry["versions"]["1"]
    # the temp files of killed writes went with the next write in their folder
    assert not [str(p) for p in (project.root / "data").rglob("*.tmp-*")], "temp files of killed writes are left"
    status = project.dvc("status")
    assert dvc_clean(status.stdout), status.stdout
