"""Writing artifacts so a crash never leaves a half-written file where a good one was."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import resource
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.core.errors import TorchshipError

NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
TEMP_PID = re.compile(r"\.tmp-(\d+)-")   # .<stem>.tmp-<writer's pid>-<random><suffix>
# How libraries word a write the disk refused, when they do not raise the OSError itself (torch: "file write failed")
LOW_SPACE = 64 * 2**20   # bytes free below which a write the library refused may have found the disk full
DISK_WORDS = re.compile(r"no space|disk full|quota|file too large|write failed|failed writing|failed to write", re.I)


class ArtifactWriteError(TorchshipError):
    """An artifact could not be written (disk full, a file-size limit, a failing writer); the old one is kept."""


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` then fsync and rename onto `path`: readers see the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(path.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.stem}.tmp-{os.getpid()}-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be read by others
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except TorchshipError:   # the writer refused its content (e.g. batch scoring found bad rows): says so itself
        raise
    except Exception as exc:  # torch and pyarrow report a full disk as RuntimeError/ArrowIOError, not OSError
        raise ArtifactWriteError(write_failure(path, exc)) from exc
    finally:
        tmp.unlink(missing_ok=True)


def remove_dead_temps(folder: Path) -> None:
    """The temp files in `folder` whose writer is gone (killed mid-write: SIGKILL, OOM; its `finally` never ran).
    A temp file's name carries its writer's PID, so a live writer's (another process writing now) is left alone."""
    for stale in folder.glob(".*.tmp-*"):
        match = TEMP_PID.search(stale.name)
        if match and not process_exists(int(match.group(1))):
            stale.unlink(missing_ok=True)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's: it exists
        return True
    return True


def disk_may_be_why(exc: BaseException, path: Path) -> bool:
    """Whether a failed write to `path` may be the disk's doing. An OSError says so by its errno (a full disk, a
    quota, a file-size limit). Torch and pyarrow hide ENOSPC and EFBIG behind errors of their own, so for those the
    disk is asked: nearly full, or a file-size limit on this process, or a message that says a write failed."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in NO_SPACE
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return True
    try:
        nearly_full = shutil.disk_usage(Path(path).parent).free < LOW_SPACE
    except OSError:
        nearly_full = False
    return nearly_full or bool(DISK_WORDS.search(str(exc)))


def write_failure(path: Path, exc: BaseException) -> str:
    """What failed, why, and that the previous file is untouched. The disk's free space and a file-size limit are
    named, and freeing space advised, only when the disk may be why; any other error is quoted as it is."""
    kept = f"the previous {path.name} is kept as it was" if path.exists() else f"no {path.name} was left behind"
    cause = f"{type(exc).__name__}: {exc}"
    if not disk_may_be_why(exc, path):
        return f"could not write {path}: {cause}. Nothing was replaced: {kept}."
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        cause = f"{os.strerror(exc.errno)} (the disk is full, or a quota or file-size limit was reached)"
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free on its disk"
    except OSError:
        free = ""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:   # torch and pyarrow hide EFBIG behind their own messages
        free += f"; this process may not grow a file past {limit} bytes (ulimit -f)"
    return f"could not write {path}: {cause}{free}. Nothing was replaced: {kept}. Free space and re-run."


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    write_atomic(path, lambda tmp: tmp.write_bytes(payload))


def write_json_atomic(path: Path, payload: Any) -> None:
    write_bytes_atomic(path, (json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def sha256_file(path: Path) -> str:
    with Path(path).open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
