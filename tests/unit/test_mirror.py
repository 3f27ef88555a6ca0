"""The checkpoint mirror (tasks/training/mirror.py): what is sent and in which order, a killed job's successor
fetching and resuming from the copy (weights_only, hash-checked), and the copy dropped once the job succeeded. The
store is DVC's local filesystem, the one DVC gives for a remote folder: the same calls as on S3."""
from __future__ import annotations

import logging

import pytest
import torch

from tasks.training import checkpoint
from tasks.training.mirror import MANIFEST, Mirror, mirrored, upload_order


@pytest.fixture
def store(tmp_path):
    from dvc_objects.fs.local import LocalFileSystem

    return LocalFileSystem(), str(tmp_path / "remote" / "checkpoints" / "train" / "fp")


def _state(step: int) -> dict:
    return {"step": step, "weights": torch.full((3,), float(step))}


def test_changed_files_go_first_and_their_manifest_last():
    files = {"fold-1/manifest.json": (10, 2), "fold-1/step-00000008.pt": (5, 2), "fold-1/step-00000004.pt": (5, 1)}
    assert upload_order(files, {"fold-1/step-00000004.pt": (5, 1)}) == ["fold-1/step-00000008.pt",
                                                                        "fold-1/manifest.json"]
    assert upload_order(files, dict(files)) == []


def test_a_killed_jobs_successor_fetches_the_copy_and_resumes_from_its_newest_step(tmp_path, store, caplog):
    fs, root = store
    killed, successor = tmp_path / "killed" / "fold-1", tmp_path / "successor"
    mirror = Mirror(fs, root, killed.parent, "train")
    for step in (4, 8, 12):
        checkpoint.save_checkpoint(killed, step, _state(step), "run-a")
        mirror.sync()
    remote = sorted(path.rsplit("/", 1)[-1] for path in fs.find(root))
    assert remote == [MANIFEST, "step-00000008.pt", "step-00000012.pt"]   # the pruned one left the store too
    fetched = Mirror(fs, root, successor, "train")
    assert fetched.fetch() == 3 and fetched.fetch() == 0   # only into a folder with no checkpoint of its own
    with caplog.at_level(logging.INFO, logger="torchship.checkpoint"):
        loaded = checkpoint.load_latest(successor / "fold-1", "run-a")
    assert loaded["step"] == 12 and "resuming from step 12" in caplog.text


def test_a_copy_damaged_on_the_way_is_skipped_never_loaded(tmp_path, store):
    fs, root = store
    for step in (4, 8):
        checkpoint.save_checkpoint(tmp_path / "job", step, _state(step), "run-a")
    Mirror(fs, root, tmp_path / "job", "train").sync()
    fs.write_bytes(f"{root}/step-00000008.pt", b"not a checkpoint")
    Mirror(fs, root, tmp_path / "next", "train").fetch()
    assert checkpoint.load_latest(tmp_path / "next", "run-a")["step"] == 4


def test_the_copy_is_dropped_when_the_job_succeeds_and_kept_when_it_fails(tmp_path, store):
    fs, root = store
    mirror = Mirror(fs, root, tmp_path / "job", "train")
    with pytest.raises(RuntimeError), mirrored(mirror):
        checkpoint.save_checkpoint(tmp_path / "job", 4, _state(4), "run-a")
        raise RuntimeError("the job failed")
    assert fs.exists(f"{root}/{MANIFEST}")   # sent once more as the job ended
    with mirrored(mirror) as end:
        end.succeeded = True
    assert not fs.exists(root)


def test_no_mirror_unless_dvc_repro_asked_and_none_when_the_remote_cannot_be_opened(tmp_path, monkeypatch, capsys):
    from tasks.core.env import CHECKPOINT_MIRROR_ENV
    from tasks.training.mirror import mirror_for

    monkeypatch.chdir(tmp_path)   # no DVC repository here
    monkeypatch.delenv(CHECKPOINT_MIRROR_ENV, raising=False)
    assert mirror_for("train", tmp_path / "checkpoints", lambda: "fp") is None
    monkeypatch.setenv(CHECKPOINT_MIRROR_ENV, "1")
    assert mirror_for("train", tmp_path / "checkpoints", lambda: "fp") is None
    assert "no checkpoint mirror, the DVC remote cannot be opened" in capsys.readouterr().err
