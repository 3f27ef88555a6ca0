"""Stage results shared through the DVC remote (tasks/stages/run_cache.py): which remotes count as shared, and a
stage run in one clone restored, not run, in a fresh clone that has only the remote, `cache: false` metric included."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.stages.run_cache import is_off_this_disk, share_stage

STAGE = """stages:
  count:
    cmd: python count.py
    deps: [count.py]
    outs: [out.txt]
    metrics:
      - report.json:
          cache: false
"""
COUNT = "open('out.txt', 'w').write('ran'); open('report.json', 'w').write('{\"rows\": 3}')\n"


@pytest.mark.parametrize(("url", "shared"), [("s3://bucket/dvc", True), ("ssh://host/dvc", True),
                                             ("gs://b/p", True), ("/srv/dvc", False), ("../remote", False),
                                             ("file:///srv/dvc", False), ("C:\\dvc", False), (None, False)])
def test_a_remote_is_shared_when_other_machines_reach_it(url, shared):
    assert is_off_this_disk(url) is shared


def _dvc(cwd, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_a_stage_shared_by_one_clone_is_restored_in_a_fresh_one(tmp_path, monkeypatch):
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    first.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=first, check=True)
    _dvc(first, "init", "-q")
    _dvc(first, "remote", "add", "-d", "team", str(tmp_path / "remote"))
    (first / "dvc.yaml").write_text(STAGE)
    (first / "count.py").write_text(COUNT)
    subprocess.run(["git", "add", "-A"], cwd=first, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=first, check=True)
    _dvc(first, "repro", "--quiet", "--single-item", "count")
    monkeypatch.chdir(first)   # as the pipeline calls it, in the project's folder
    assert share_stage("count").startswith("shared through the DVC remote's run cache (2 object(s)")
    subprocess.run(["git", "clone", "-q", str(first), str(fresh)], check=True)
    (fresh / "count.py").chmod(0o000)   # were it run, it would fail
    assert "Stage 'count' is cached - skipping run" in _dvc(fresh, "repro", "--pull", "--single-item", "count")
    assert (fresh / "out.txt").read_text() == "ran" and (fresh / "report.json").read_text() == '{"rows": 3}'
