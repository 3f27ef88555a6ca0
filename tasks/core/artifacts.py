"""Writing artifacts so a crash never leaves a half-written file where a good one was."""
from __future__ import annotations

import contextlib
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

from tasks.core.env import (
    AWS_KEY_ID_ENV,
    AWS_SECRET_ENV,
    MLFLOW_ADMIN_PASSWORD_ENV,
    MLFLOW_FLASK_KEY_ENV,
    MLFLOW_PASSWORD_ENV,
    PG_PASSWORD_ENV,
    PREFECT_AUTH_ENV,
    PREFECT_SERVER_AUTH_ENV,
    TOKEN_ENV,
    WEBHOOK_URL_ENV,
)
from tasks.core.errors import TorchshipError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)   # the disk, or a quota, is full: only these are "free space"
TEMP_PID = re.compile(r"\.tmp-(\d+)-")   # .<stem>.tmp-<writer's pid>-<random><suffix>
# Free bytes below which a write a library refused without an errno (torch: "file write failed") may have found the
# disk full
LOW_SPACE = 64 * 2**20
# An error as a message may quote it (`redacted`): what a request or a credential could have put in its message is
# taken out: the value of every secret variable of this environment, a URL's user, password and query (a presigned
# link's signature), an access key id, a bearer token, a `key=value` secret, and any long opaque token.
SECRET_ENVS = (AWS_KEY_ID_ENV, AWS_SECRET_ENV, MLFLOW_ADMIN_PASSWORD_ENV, MLFLOW_FLASK_KEY_ENV, MLFLOW_PASSWORD_ENV,
               PG_PASSWORD_ENV, PREFECT_AUTH_ENV, PREFECT_SERVER_AUTH_ENV, TOKEN_ENV, WEBHOOK_URL_ENV)
HIDDEN = "[redacted]"
MAX_CHARS = 300
PATTERNS = (
    re.compile(r"(?<=://)[^/\s@]+@"),                                    # user:password@ in a URL
    re.compile(r"(?<=[?&])[^\s#'\"]+"),                                  # a URL's query (signatures, tokens)
    re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{12,}\b"),             # an AWS access key id
    re.compile(r"(?i)\bbearer\s+\S+"),                                   # an Authorization header's token
    re.compile(r"(?i)\b(?:password|passwd|secret|token|signature|credential|api[_-]?key|auth)[^\s=:]*\s*[=:]\s*\S+"),
    re.compile(r"[A-Za-z0-9+_=-]{32,}"),                                 # a long opaque token (a key, a signature)
)


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
        raise ArtifactWriteError(write_failure(path, exc, tmp)) from exc
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


def disk_cause(exc: BaseException, path: Path, tmp: Path | None = None) -> str | None:
    """"space" when the disk (or a quota) is full, "size limit" when this process's file-size limit (ulimit -f) stopped
    the write, None when neither is why. An OSError says so by its errno (ENOSPC, EDQUOT; EFBIG); torch and pyarrow
    hide it behind errors of their own, so for those the disk is asked (nearly full?) and the half-written temp file
    is measured (as large as the limit?)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return "space" if exc.errno in NO_SPACE else "size limit" if exc.errno == errno.EFBIG else None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    with contextlib.suppress(OSError):
        if limit != resource.RLIM_INFINITY and tmp is not None and tmp.stat().st_size >= limit:
            return "size limit"
    with contextlib.suppress(OSError):
        if shutil.disk_usage(Path(path).parent).free < LOW_SPACE:
            return "space"
    return None


def disk_may_be_why(exc: BaseException, path: Path) -> bool:
    """Whether a failed write to `path` may be the disk's doing (its space, a quota, the file-size limit): what a
    caller that cannot measure the temp file asks before it blames a library (write_atomic then says which)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in (*NO_SPACE, errno.EFBIG)
    return (disk_cause(exc, path) is not None
            or resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY)


def write_failure(path: Path, exc: BaseException, tmp: Path | None = None) -> str:
    """What failed, why, and that the previous file is untouched. Freeing space is advised only for a full disk or
    quota, raising the file-size limit only when that limit stopped the write; any other error is quoted by its type
    and its message (redacted)."""
    kept = f"the previous {path.name} is kept as it was" if path.exists() else f"no {path.name} was left behind"
    cause = redacted(exc)
    why = disk_cause(exc, path, tmp)
    if why is None:
        return f"could not write {path}: {cause}. Nothing was replaced: {kept}."
    free = ""
    with contextlib.suppress(OSError):
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free on its disk"
    if why == "space":
        if isinstance(exc, OSError):
            cause = f"{os.strerror(exc.errno)} (the disk is full, or a quota was reached)"
        return f"could not write {path}: {cause}{free}. Nothing was replaced: {kept}. Free space and re-run."
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if isinstance(exc, OSError):
        cause = f"{os.strerror(exc.errno)} (a file-size limit was reached, not the disk's free space)"
    return (f"could not write {path}: {cause}{free}; this process may not grow a file past {limit} bytes (ulimit -f). "
            f"Nothing was replaced: {kept}. Raise the limit (ulimit -f) and re-run.")


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    write_atomic(path, lambda tmp: tmp.write_bytes(payload))


def write_json_atomic(path: Path, payload: Any) -> None:
    write_bytes_atomic(path, (json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def sha256_file(path: Path) -> str:
    with Path(path).open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def redacted(exc: BaseException) -> str:
    """`Type: message`: the first line of the message, secrets taken out, at most MAX_CHARS characters."""
    text = (str(exc).strip().splitlines() or [""])[0]
    for name in SECRET_ENVS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, HIDDEN)
    for pattern in PATTERNS:
        text = pattern.sub(HIDDEN, text)
    text = text[:MAX_CHARS] + (" ..." if len(text) > MAX_CHARS else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
