"""A failed run puts the last good dvc.lock back (tasks/stages/repro.py last_good_outputs): with the atomic writer, so a
write that fails half-way leaves a whole dvc.lock (never half of one), and a `dvc checkout` that fails is said, not
ignored: the error names both, and what to run."""
from __future__ import annotations

from pathlib import Path

import pytest

from tasks.core.errors import TorchshipError
from tasks.stages.repro import StageFailed, last_good_outputs

GOOD = "schema: '2.0'\nstages:\n" + "".join(f"  stage{i}:\n    cmd: python -m tasks.stage{i}\n" for i in range(200))
RUNS = "schema: '2.0'\nstages: {}\n"   # what the failing run had written meanwhile


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "dvc.lock").write_text(GOOD)
    return tmp_path


def test_a_restore_whose_write_fails_half_way_leaves_a_whole_dvc_lock(project, monkeypatch):
    real = Path.write_bytes

    def half_then_fail(path: Path, data: bytes) -> int:   # the disk gives out half-way through any write
        real(path, data[:len(data) // 2])
        raise OSError(5, "Input/output error")

    with pytest.raises(TorchshipError) as failed, last_good_outputs(project):
        (project / "dvc.lock").write_text(RUNS)
        monkeypatch.setattr(Path, "write_bytes", half_then_fail)
        raise StageFailed("stage 'train' failed: out of memory")
    monkeypatch.undo()
    assert (project / "dvc.lock").read_text() in (GOOD, RUNS), "dvc.lock was left half-written"
    message = str(failed.value)
    assert "stage 'train' failed: out of memory" in message and "Putting back the last good outputs failed" in message


def test_a_failed_checkout_is_reported_with_the_runs_own_error(project):
    # no DVC repository here: `dvc checkout` fails
    with pytest.raises(TorchshipError) as failed, last_good_outputs(project):
        (project / "dvc.lock").write_text(RUNS)
        raise StageFailed("stage 'train' failed: out of memory")
    assert (project / "dvc.lock").read_text() == GOOD
    message = str(failed.value)
    assert "stage 'train' failed: out of memory" in message and "`dvc checkout --force` failed" in message, message
