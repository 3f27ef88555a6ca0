"""Asking DVC what would run and why, and running one stage through `dvc repro` so DVC decides
skip-or-run from its hashes and records dvc.lock."""
from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from tasks.core.env import CHECKPOINT_MIRROR_ENV, STAGE_LOG_ENV, STAGE_RAN_ENV
from tasks.core.errors import TorchshipError
from tasks.core.procs import Child, tee_lines
from tasks.stages import run_cache
from tasks.stages.stage_list import REFRESHED_BY_TORCHSHIP, headline, metrics_files

LOCK_FILE = Path("dvc.lock")
log = logging.getLogger("torchship.stages")


class StageFailed(TorchshipError):
    """A DVC stage exited non-zero; the message is the stage's own."""


class StageOutcome(BaseModel):
    stage: str
    status: str          # ran | skipped
    reason: str
    seconds: float
    headline: str = ""


def read_lock(cwd: Path = Path(".")) -> dict:
    """dvc.lock's `stages` mapping ({} before the first run): the one place it is parsed."""
    from ruamel.yaml import YAML

    lock = cwd / LOCK_FILE
    return (YAML(typ="safe").load(lock.read_text()) or {}).get("stages") or {} if lock.exists() else {}


def stage_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """dvc.yaml says `python -m tasks.<stage>`: put this interpreter's folder first on PATH so
    `python` is the project's environment even when no venv is activated."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), **(extra or {})}


def run_dvc(root: Path, *args: str, timeout: float | None = None) -> None:
    """`dvc ARGS` in `root` with this environment's interpreter; a failure raises with DVC's own last lines."""
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True,
                            env=stage_environment(), timeout=timeout)
    if result.returncode != 0:
        raise TorchshipError(f"dvc {' '.join(args)} failed in {Path(root).resolve()}: "
                             f"{' '.join(result.stderr.strip().splitlines()[-3:])}")


def repair_dvc_rwlock(cwd: Path = Path(".")) -> bool:
    """DVC rewrites `.dvc/tmp/rwlock` in place (truncate, then dump) under its `rwlock.lock`: a dvc process killed
    in between leaves it empty or cut short, and every dvc command after it fails with "JSON structure is
    corrupted". Under that same guard, a file that does not parse is removed (DVC reads a missing one as no locks);
    a whole one is left alone. Called by a run that holds the workspace, so no torchship process of this folder is
    running DVC: the file's writer was killed. True when it repaired."""
    import json

    from dvc.lock import LockError, make_lock

    tmp = cwd / ".dvc" / "tmp"
    path = tmp / "rwlock"
    if not path.exists():
        return False
    try:
        with make_lock(str(tmp / "rwlock.lock"), tmp_dir=str(tmp)):
            try:
                json.loads(path.read_text(encoding="utf-8"))
                return False
            except FileNotFoundError:
                return False
            except (ValueError, UnicodeDecodeError):
                path.unlink()
    except LockError:   # a live dvc command is editing it right now: the file is its, and DVC says so if it fails
        return False
    log.warning("removed DVC's half-written %s (a dvc process was killed while writing it)", path)
    return True


def stage_changes(stage: str | None = None, cwd: Path = Path(".")) -> dict[str, list[str]]:
    """DVC's status as {stage: [why it would run, ...]}; an empty dict means up to date."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo(str(cwd)) as repo:
            raw = repo.status(targets=[stage] if stage else None)
    except DvcException as exc:
        raise StageFailed(f"dvc status failed: {exc}") from None
    changes = {name: _describe(entries) for name, entries in raw.items()
               if (":" not in name or name.endswith(".dvc")) and name not in REFRESHED_BY_TORCHSHIP}
    lock = read_lock(cwd)
    for name, reasons in changes.items():
        if name not in lock:
            changes[name] = ["never run in this checkout (no record in dvc.lock)"]
            continue
        detail = changed_params(lock[name], cwd)
        if detail:
            changes[name] = [r for r in reasons if not r.startswith("deps params.yaml")] + detail
    return changes


def record_stage(stage: str, cwd: Path = Path(".")) -> None:
    """Write the stage's current deps and outs to dvc.lock without running it (`dvc commit`): for the source
    stage, whose output torchship has just written itself, so plain `dvc status` then lists nothing to do."""
    from dvc.exceptions import DvcException
    from dvc.lock import LockError
    from dvc.repo import Repo

    repair_dvc_rwlock(cwd)
    dvc_log = logging.getLogger("dvc")
    level = dvc_log.level
    dvc_log.setLevel(logging.WARNING)    # not "Updating lock file 'dvc.lock'" in every run's output
    try:
        with Repo(str(cwd)) as repo:
            repo.commit(stage, force=True)
    except LockError:
        raise StageFailed(f"dvc commit {stage}: another dvc command holds this folder's DVC lock (.dvc/tmp/lock): "
                          "one run by hand, or a stage a killed run left behind; torchship's own runs wait for the "
                          "workspace lock before they reach DVC. Let it finish (or stop it) and run again.") from None
    except DvcException as exc:
        raise StageFailed(f"dvc commit {stage} failed: {exc}") from None
    finally:
        dvc_log.setLevel(level)


def changed_params(locked_stage: dict, cwd: Path = Path(".")) -> list[str]:
    """Param values that differ from what dvc.lock recorded for the stage: 'train.epochs 3 -> 2'."""
    from tasks.config import read_params_file

    old = _flatten(locked_stage.get("params", {}).get("params.yaml", {}))
    current = read_params_file(cwd / "params.yaml")
    new = {}
    for key in old:
        node = current
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        new[key] = node
    flat_new = _flatten(new)
    return [f"param {key}: {old.get(key)!r} -> {flat_new.get(key)!r}"
            for key in sorted(set(old) | set(flat_new)) if old.get(key) != flat_new.get(key)]


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _describe(entries: list) -> list[str]:
    reasons = []
    for entry in entries:
        if isinstance(entry, str):
            reasons.append(entry)
            continue
        for kind, changes in entry.items():
            if isinstance(changes, dict):
                reasons += [f"{kind.replace('changed ', '')} {path}: {_what(what)}" for path, what in changes.items()]
            else:
                reasons.append(f"{kind}: {changes}")
    return reasons or ["changed"]


def _what(change) -> str:
    """'modified', or for params {'train.epochs': 'modified'} -> 'train.epochs modified'."""
    if isinstance(change, dict):
        return ", ".join(f"{key} {value}" for key, value in change.items())
    return str(change)


@contextlib.contextmanager
def last_good_outputs(cwd: Path = Path(".")) -> Iterator[None]:
    """On any failure inside: put dvc.lock and the uncached metric files back and check the last good
    outputs out of the DVC cache, so a rejected batch never stays in data/ as if it were the training set."""
    files = [LOCK_FILE, *metrics_files(cwd)]
    saved = {path: (cwd / path).read_bytes() if (cwd / path).exists() else None for path in files}
    try:
        yield
    except BaseException as exc:
        if saved[LOCK_FILE] is None:  # before the first good run there is nothing to go back to
            raise
        problem = restore_last_good(saved, cwd)
        if problem is None:
            raise
        log.error("putting back the last good outputs failed: %s", problem)
        if not isinstance(exc, TorchshipError):   # Ctrl-C, SIGTERM, a bug: as it was, the problem logged
            raise
        raise StageFailed(f"{exc}\nPutting back the last good outputs failed too: {problem}") from exc


def restore_last_good(saved: dict[Path, bytes | None], cwd: Path = Path(".")) -> str | None:
    """dvc.lock and the metric files put back as `saved` (each atomically: never half a file), then the outputs
    they name checked out of the DVC cache; what went wrong, or None."""
    from tasks.core.artifacts import ArtifactWriteError, write_bytes_atomic

    try:
        for path, content in saved.items():
            if content is not None:
                write_bytes_atomic(cwd / path, content)
    except ArtifactWriteError as exc:
        return f"{exc} data/ holds this run's outputs; put {LOCK_FILE} back from git and run `dvc checkout --force`."
    result = subprocess.run([sys.executable, "-m", "dvc", "checkout", "--force", "--quiet"], cwd=cwd,
                            capture_output=True, text=True, env=stage_environment())
    if result.returncode != 0:
        said = " ".join(result.stderr.strip().splitlines()[-3:]) or f"exit {result.returncode}"
        return (f"`dvc checkout --force` failed ({said}): {LOCK_FILE} is the last good one, but data/ may still "
                "hold this run's outputs; run it by hand once that is fixed.")
    return None


def reproduce(stage: str, env: dict[str, str] | None = None, echo=sys.stdout, cwd: Path = Path("."),
              force: bool = False, log_stage_run: Callable[[Path], object] | None = None) -> StageOutcome:
    """Run `dvc repro -s <stage>` if DVC says it changed (always, with `force`: a rebuild must not come from
    DVC's run cache); the stage's own error becomes StageFailed. With a DVC remote off this disk (the team
    topology, tasks/stages/run_cache.py) a finished run elsewhere is restored instead of run, and what runs is
    shared. `log_stage_run`: the stage records its MLflow run in a folder (STAGE_LOG_ENV) and this logs it, once the
    stage has ended, failed or not; it must not raise (the stage's own outcome is what this reports)."""
    started = time.perf_counter()
    repair_dvc_rwlock(cwd)
    changes = ["forced (rebuild)"] if force else stage_changes(stage, cwd).get(stage)
    if not changes:
        return StageOutcome(stage=stage, status="skipped", reason="deps, params and outs unchanged",
                            seconds=time.perf_counter() - started, headline=headline(stage, cwd))
    echo.write(f"── {stage} ── {'; '.join(changes)[:200]}\n")
    echo.flush()
    shared = not force and run_cache.shared_remote(cwd)
    with tempfile.TemporaryDirectory(prefix="torchship-stage-") as marks:
        ran = Path(marks) / "ran"   # the stage touches it when it runs: DVC restored it from the run cache if not
        recorded = Path(marks) / "mlflow-run"
        extra = {**(env or {}), **({STAGE_LOG_ENV: str(recorded)} if log_stage_run else {}),
                 **({STAGE_RAN_ENV: str(ran), CHECKPOINT_MIRROR_ENV: "1"} if shared else {})}
        try:
            _run_repro(stage, [*(["--pull"] if shared else []), *(["--force"] if force else [])], extra, echo, cwd)
        finally:
            if log_stage_run:
                log_stage_run(recorded)
        restored = shared and not ran.exists()
    if restored:
        echo.write(f"{stage}: restored from the DVC remote's run cache (a finished run had the same code, data "
                   "and params): not run\n")
    elif shared:
        echo.write(f"{stage}: {run_cache.share_stage(stage, cwd)}\n")
    return StageOutcome(stage=stage, status="restored" if restored else "ran", reason="; ".join(changes)[:300],
                        seconds=time.perf_counter() - started, headline=headline(stage, cwd))


def _run_repro(stage: str, flags: list[str], env: dict[str, str], echo, cwd: Path) -> None:
    """`dvc repro --single-item` of the stage in a session of its own, its stderr teed to `echo`."""
    command = [sys.executable, "-m", "dvc", "repro", "--quiet", "--single-item", *flags, stage]
    process = subprocess.Popen(command, cwd=cwd, env=stage_environment(env), stdout=None, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    child = Child(f"dvc repro {stage}", process, Path(os.devnull))
    tail: collections.deque[str] = collections.deque(maxlen=60)
    reader = threading.Thread(target=tee_lines, args=(process.stderr, tail, echo), daemon=True)
    reader.start()
    try:
        code = process.wait()
    finally:  # interrupted (Ctrl-C, SIGTERM turned into an exception): the stage and its torchrun go too
        child.stop()
    reader.join()
    if code != 0:
        raise StageFailed(_stage_error(stage, list(tail), code))


def _stage_error(stage: str, lines: list[str], code: int) -> str:
    """The stage's own one-paragraph message if it printed one, else DVC's error lines."""
    marker = f"torchship {stage} failed:"
    own = [i for i, line in enumerate(lines) if line.startswith("torchship ") and " failed: " in line]
    if own:  # the first one is the root cause (torchrun's launcher reports after its worker)
        first = lines[own[0]].replace(marker, f"stage '{stage}' failed:", 1).strip()
        listed = list(itertools.takewhile(lambda line: line.startswith("  - "), lines[own[0] + 1:]))
        return "\n".join([first] + [line.rstrip() for line in listed])  # a refusal's list of every problem
    errors = [line for line in lines if line.startswith("ERROR")] or lines[-5:]
    return f"stage '{stage}' failed (exit {code}): " + " ".join(e.strip() for e in errors)
