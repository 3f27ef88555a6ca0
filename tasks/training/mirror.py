"""A training job's checkpoints mirrored to the shared store, so a job killed with its machine resumes on another
(the team topology: tasks/stages/run_cache.py; `dvc repro` sets CHECKPOINT_MIRROR_ENV for the stage, never for a
rebuild). The job's launcher, outside torchrun, does it: before torchrun starts it fetches the job's copy when this
tree has no checkpoint; while the job runs it sends what changed, at most every INTERVAL_S (checkpoint files before
the manifest that names them, so the store's manifest never names a file it lacks); once the job succeeded it drops
the copy (resume state is for a job that did not finish). The copy is keyed by the job's fingerprint (params and
data: tasks/training/job.py), so only the same run resumes from it, and the trainer still loads a checkpoint only
weights_only and only if its sha256 matches the manifest: a damaged copy is skipped, never loaded."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from tasks.core.env import CHECKPOINT_MIRROR_ENV

INTERVAL_S = 1.0            # a checkpoint is a few hundred KB at most here; a sync that finds nothing new is a stat
MANIFEST = "manifest.json"  # tasks/training/checkpoint.py's
Stamp = tuple[int, int]     # (size, mtime_ns): a checkpoint file is replaced whole (temp + rename), never edited


def local_files(folder: Path) -> dict[str, Stamp]:
    """Every checkpoint file under `folder` by its POSIX path relative to it; temp files (a dot first) left out."""
    found = {}
    for path in folder.rglob("*") if folder.exists() else ():
        relative = path.relative_to(folder)
        if path.is_file() and not any(part.startswith(".") for part in relative.parts):
            with contextlib.suppress(FileNotFoundError):   # pruned meanwhile (checkpoint.KEEP)
                stat = path.stat()
                found[relative.as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def upload_order(files: dict[str, Stamp], sent: dict[str, Stamp]) -> list[str]:
    """The files new or changed since they were sent, manifests last."""
    changed = [name for name, stamp in files.items() if sent.get(name) != stamp]
    return sorted(changed, key=lambda name: (PurePosixPath(name).name == MANIFEST, name))


class Mirror:
    """One job's checkpoint folder and its copy under `root` on the store's filesystem (DVC's, for the remote)."""

    def __init__(self, fs, root: str, folder: Path, label: str):
        self.fs, self.root, self.folder, self.label = fs, root.rstrip("/"), folder, label
        self.sent: dict[str, Stamp] = {}

    def fetch(self) -> int:
        """The store's copy into the folder when it holds no manifest (checkpoints first); how many files."""
        if any(self.folder.rglob(MANIFEST)) or not self.fs.exists(self.root):
            return 0
        names = [self.fs.relpath(path, self.root).replace(os.sep, "/") for path in self.fs.find(self.root)]
        for name in sorted(names, key=lambda name: (PurePosixPath(name).name == MANIFEST, name)):
            target = self.folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.fetch")
            self.fs.get_file(self.fs.join(self.root, name), str(partial))
            os.replace(partial, target)
        self.sent = local_files(self.folder)
        return len(names)

    def sync(self) -> list[str]:
        """Send what changed since the last sync, then remove from the store what the folder no longer holds (the
        trainer keeps the newest checkpoints only). The names sent."""
        files = local_files(self.folder)
        sent = []
        for name in upload_order(files, self.sent):
            try:
                self.fs.put_file(str(self.folder / name), self.fs.join(self.root, name))
            except FileNotFoundError:   # pruned since it was listed: the next sync sends the manifest that says so
                break
            self.sent[name] = files[name]
            sent.append(name)
        for name in [name for name in self.sent if name not in files]:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self.fs.join(self.root, name))
            del self.sent[name]
        return sent

    def drop(self) -> None:
        """Remove the store's copy (the job finished: nothing to resume)."""
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


def mirror_for(stage: str, folder: Path, fingerprint: Callable[[], str], echo=None) -> Mirror | None:
    """The job's mirror on the DVC default remote when `dvc repro` asked for one (CHECKPOINT_MIRROR_ENV), else None
    (also when the remote cannot be opened: said, never fatal). `fingerprint` is asked only then: it hashes the
    job's data, which a launcher that mirrors nothing need not have."""
    if not os.environ.get(CHECKPOINT_MIRROR_ENV):
        return None
    from tasks.stages.run_cache import remote_store

    try:
        fs, root = remote_store()
    except Exception as exc:
        (echo or sys.stderr).write(f"{stage}: no checkpoint mirror, the DVC remote cannot be opened "
                                   f"({type(exc).__name__}: {str(exc)[:200]}); training goes on with this disk's "
                                   "checkpoints\n")
        return None
    key = f"{re.sub(r'[^A-Za-z0-9_-]+', '-', stage)}/{fingerprint()}"
    return Mirror(fs, fs.join(root, "torchship", "checkpoints", key), folder, stage)


class JobEnd:
    """Set by the job's launcher: whether the job succeeded (its copy is then dropped)."""

    succeeded = False


@contextlib.contextmanager
def mirrored(mirror: Mirror | None, echo=sys.stderr) -> Iterator[JobEnd]:
    """Fetch before the job, sync while it runs and once after it failed or stopped; drop the copy if it succeeded.
    A store that fails is reported, never fatal: the job's own checkpoints on this disk are intact."""
    end = JobEnd()
    if mirror is None:
        yield end
        return
    if fetched := _tried(mirror.fetch, mirror, echo):
        echo.write(f"{mirror.label}: fetched {fetched} checkpoint file(s) of this run from the DVC remote (a run "
                   "that stopped before it finished)\n")
        echo.flush()
    done = threading.Event()
    thread = threading.Thread(target=_keep_synced, args=(mirror, done, echo), daemon=True)
    thread.start()
    try:
        yield end
    finally:
        done.set()
        thread.join()
        if end.succeeded:
            _tried(mirror.drop, mirror, echo)
        else:
            _report(mirror, _tried(mirror.sync, mirror, echo), echo)


def _keep_synced(mirror: Mirror, done: threading.Event, echo) -> None:
    while not done.wait(INTERVAL_S):
        _report(mirror, _tried(mirror.sync, mirror, echo), echo)


def _report(mirror: Mirror, sent, echo) -> None:
    for name in sent or ():
        if PurePosixPath(name).name != MANIFEST:
            echo.write(f"{mirror.label}: checkpoint {name} mirrored to the DVC remote\n")
            echo.flush()


def _tried(action, mirror: Mirror, echo):
    try:
        return action()
    except Exception as exc:   # the store's words may name the bucket, never a key: boto and DVC do not print them
        echo.write(f"{mirror.label}: the checkpoint mirror failed ({type(exc).__name__}: {str(exc)[:200]}); "
                   "training goes on with this disk's checkpoints\n")
        echo.flush()
        return None
