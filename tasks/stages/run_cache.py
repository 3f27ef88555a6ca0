"""What a finished stage leaves for the next run on another machine (the team topology: the DVC default remote is
off this disk). Each worker flow run works in a fresh clone, so nothing a killed run produced on its disk is there
for the next one:
- after a DVC stage runs, its run-cache entry and every object that entry names (its `cache: false` metrics too)
  go to the default remote (`share_stage`), and stages run with `dvc repro --pull`, so DVC pulls the run cache and
  restores a stage whose command, deps and params match a finished run ("Stage 'x' is cached - skipping run");
- the train and compress stages mirror their checkpoints there (tasks/training/mirror.py).
DVC run-caches only stages with no persist output that are not always changed (`_can_hash` in dvc/stage/cache.py):
validate, baseline, export and profile. `source` is always changed; prepare, train and compress keep persist
outputs (the last good split, the resume state), so they run again: prepare is deterministic and cheap, train and
compress resume from their mirrored checkpoints.
On by itself, no setting: a remote on local disk is this machine's (the embedded default), where the next run finds
DVC's cache and the checkpoints in the same tree already; a remote on a store is one every worker reaches."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit


def default_remote_url(cwd: Path = Path(".")) -> str | None:
    """The DVC default remote's URL (None without one), as .dvc/config and its local and user layers set it."""
    from dvc.repo import Repo

    with Repo(str(cwd)) as repo:
        name = repo.config["core"].get("remote")
        return repo.config["remote"].get(name, {}).get("url") if name else None


def is_off_this_disk(url: str | None) -> bool:
    """True for a remote other machines reach (s3://, gs://, ssh://...); False for none or a local path."""
    if not url:
        return False
    scheme = urlsplit(url).scheme
    return scheme not in ("", "file") and len(scheme) > 1   # len 1: a Windows drive letter


def shared_remote(cwd: Path = Path(".")) -> bool:
    return is_off_this_disk(default_remote_url(cwd))


def remote_store(cwd: Path = Path(".")):
    """(filesystem, root path) of the default remote, as DVC reaches it (its credentials from the environment)."""
    from dvc.repo import Repo

    with Repo(str(cwd)) as repo:
        remote = repo.cloud.get_remote()
        return remote.fs, remote.path


def share_stage(stage: str, cwd: Path = Path(".")) -> str:
    """Push the stage's newest run-cache entry and every object it names to the default remote, in words. DVC's own
    `push --run-cache` sends every entry but not the objects of `cache: false` outputs, which a restore on another
    machine needs (it pulls what the entry names). Never fatal: the stage's result is good either way."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc.stage.cache import _can_hash, _get_cache_hash, _get_stage_hash  # DVC's own rules (pinned <4)

    try:
        with Repo(str(cwd)) as repo:
            (target,) = repo.stage.collect(stage)   # DVC resolves it from the process's folder: call with cwd '.'
            if not _can_hash(target):
                return "not shared: DVC cannot run-cache it (a persist output, or always changed)"
            entry = repo.stage_cache._load(target)
            if entry is None:
                return "not shared: no run-cache entry"
            cached = repo.stage_cache._create_stage(entry, wdir=target.wdir)
            objects = sum(len(repo.cloud.push(objs).transferred) for objs in cached.get_used_objs().values())
            key, value = _get_stage_hash(target), _get_cache_hash(entry)
            remote = repo.cloud.get_remote()
            remote.fs.makedirs(remote.fs.join(remote.path, "runs", key[:2], key), exist_ok=True)
            remote.fs.put_file(repo.stage_cache._get_cache_path(key, value),
                               remote.fs.join(remote.path, "runs", key[:2], key, value))
    except (DvcException, OSError) as exc:
        return f"not shared ({type(exc).__name__}: {str(exc)[:200]}): a run elsewhere runs it again"
    return f"shared through the DVC remote's run cache ({objects} object(s) sent)"
