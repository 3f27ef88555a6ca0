"""A dvc process killed while it rewrote `.dvc/tmp/rwlock` (DVC truncates the file, then dumps it) leaves it empty or
cut short, and every dvc command after it failed with "JSON structure is corrupted": the kill ladder's next run
failed at its first `dvc commit source` (tests/reliability/test_kill_ladder.py, once in CI). A run that holds the
workspace repairs it before it reaches DVC; a whole file is left alone. In process, on a real DVC repository: the
kill itself is the ladder's."""
from __future__ import annotations

import json

import pytest

from tasks.stages.repro import record_stage, repair_dvc_rwlock

pytestmark = pytest.mark.reliability


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A DVC repository (no git) with one stage whose output exists: what `dvc commit` records."""
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True).close()
    (tmp_path / "dvc.yaml").write_text("stages:\n  source:\n    cmd: echo made > made.txt\n    outs:\n"
                                       "    - made.txt:\n        cache: false\n")
    (tmp_path / "made.txt").write_text("made\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("left", ["", '{"read": {"made.txt": [{"pid": 4', "\x00\x00\x00"])
def test_a_half_written_rwlock_no_longer_fails_the_next_dvc_command(repository, left):
    from dvc.repo import Repo
    from dvc.rwlock import RWLockFileCorruptedError

    rwlock = repository / ".dvc" / "tmp" / "rwlock"
    rwlock.write_text(left)
    with pytest.raises(RWLockFileCorruptedError), Repo(str(repository)) as repo:   # what the ladder met
        repo.commit("source", force=True)
    record_stage("source", repository)
    assert "source" in (repository / "dvc.lock").read_text()
    assert not rwlock.exists() or json.loads(rwlock.read_text()) is not None


def test_a_whole_rwlock_is_left_as_it_is(repository):
    rwlock = repository / ".dvc" / "tmp" / "rwlock"
    whole = json.dumps({"read": {}, "write": {"made.txt": {"pid": 1, "cmd": "dvc repro"}}})
    rwlock.write_text(whole)
    assert repair_dvc_rwlock(repository) is False
    assert rwlock.read_text() == whole
    assert repair_dvc_rwlock(repository / "nowhere") is False   # no DVC folder: nothing to repair
