"""Disk full while writing an artifact, a checkpoint or the request log. The writing process is a real child with
RLIMIT_FSIZE set (the kernel refuses to grow a file past the limit: EFBIG, as a full disk gives ENOSPC), and, where
this machine lets a test mount one, a 1 MiB tmpfs (a real ENOSPC). What must hold: a clear error naming the file
and the cause, the previous artifact byte-for-byte as it was, no temp file left, and a request log that keeps
serving and never ends in half a line."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.reliability
LIMIT = 64 << 10   # bytes a child may grow a file to


def limited(limit: int = LIMIT):
    """preexec_fn: cap the size of any file the child writes (soft limit only: the child may lift it again)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def run_child(code: str, cwd: Path, limit: int | None = LIMIT, args: list[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, preexec_fn=limited(limit) if limit else None,
                          # no .pyc from a capped child: Python's bytecode cache ignores a short write, and a
                          # module first imported here would leave a truncated .pyc that breaks every later import
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, or a skip when this machine does not let the test mount one."""
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:120]}); RLIMIT_FSIZE cases cover it")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


WRITE_ARTIFACTS = """
    import json, os, sys
    from pathlib import Path
    import torch
    from tasks.core.artifacts import ArtifactWriteError, write_bytes_atomic, write_atomic
    from tasks.training.checkpoint import save_checkpoint

    def files():
        return {str(p): p.read_bytes().hex() for p in sorted(Path(".").rglob("*")) if p.is_file()}

    # the previous artifacts, small enough to fit
    write_bytes_atomic(Path("report.json"), b'{"previous": true}')
    write_atomic(Path("model.pt"), lambda tmp: torch.save(torch.ones(10), tmp))
    save_checkpoint(Path("checkpoints"), 10, {"w": torch.ones(10)}, "run")
    if sys.argv[1] == "tmpfs":   # fill the disk, then give back 8 KiB: the new, larger artifacts cannot fit
        with open("filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(bytes(64 << 10))
            except OSError:
                pass
            os.ftruncate(filler.fileno(), max(0, os.fstat(filler.fileno()).st_size - (8 << 10)))
    before = files()
    results = {}
    cases = {
        "json report": lambda: write_bytes_atomic(Path("report.json"), b"[" + b"1," * 200_000 + b"1]"),
        "torch weights": lambda: write_atomic(Path("model.pt"), lambda tmp: torch.save(torch.zeros(200_000), tmp)),
        "checkpoint": lambda: save_checkpoint(Path("checkpoints"), 20, {"w": torch.zeros(200_000)}, "run"),
    }
    for name, write in cases.items():
        try:
            write()
            results[name] = "written"
        except ArtifactWriteError as exc:
            results[name] = str(exc)
    after = files()
    print(json.dumps({"results": results, "changed": sorted(k for k in set(before) | set(after)
                                                            if before.get(k) != after.get(k))}))
"""


@pytest.mark.parametrize("disk", ["rlimit", "tmpfs"])
def test_a_full_disk_fails_the_write_clearly_and_keeps_the_previous_artifact(tmp_path, disk):
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(small_tmpfs(tmp_path)) if disk == "tmpfs" else tmp_path
        result = run_child(WRITE_ARTIFACTS, folder, limit=LIMIT if disk == "rlimit" else None, args=[disk])
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    cause = "File too large" if disk == "rlimit" else "No space left on device"
    for name, message in outcome["results"].items():
        assert message.startswith("could not write "), f"{name}: {message}"
        assert "Nothing was replaced: " in message and "MiB free on its disk" in message, message
        if name == "json report":
            assert cause in message, message
        else:   # torch reports the failed write as its own RuntimeError: the message adds the space and the limit
            assert ("ulimit -f" if disk == "rlimit" else " 0 MiB free") in message, message
    assert "the previous report.json is kept" in outcome["results"]["json report"]
    assert not outcome["changed"], f"a failed write changed or left files: {outcome['changed']}"


REQUEST_LOG = """
    import json, logging, resource
    from pathlib import Path
    from serving.request_log import RequestLog
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(message)s")
    path = Path("requests.jsonl")
    log = RequestLog(path, flush_seconds=3600)
    log.open()
    line = lambda i: json.dumps({"id": i, "pad": "x" * 200}) + "\\n"
    for i in range(LINES_BEFORE):
        log.append(line(i))
    log.flush()
    size_before = path.stat().st_size
    for i in range(LINES_BEFORE, LINES_BEFORE + 2000):     # far more than the limit lets through
        log.append(line(i))
    log.flush()                                            # refused: logged, dropped, file cut back
    size_after_failure = path.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))   # space freed
    log.append(line("after"))
    log.close()
    print(json.dumps({"before": size_before, "after_failure": size_after_failure}))
"""


def test_a_full_disk_drops_request_log_lines_whole_and_the_log_goes_on(tmp_path):
    lines_before = 100   # ~21 KiB, under the limit
    result = run_child(REQUEST_LOG.replace("LINES_BEFORE", str(lines_before)), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    sizes = json.loads(result.stdout.strip().splitlines()[-1])
    assert "could not write 2000 line(s) to requests.jsonl, dropped: [Errno 27] File too large" in result.stderr
    assert sizes["after_failure"] == sizes["before"], "the failed write left part of its lines in the file"
    ids = [json.loads(line)["id"] for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert ids == [*range(lines_before), "after"]   # every line whole: the ones before, none of the refused, the next


def test_a_killed_writers_temp_file_goes_with_the_next_write_in_its_folder(tmp_path):
    """SIGKILL mid-write leaves the temp file (its `finally` never runs); the next write in the folder removes it,
    and leaves alone the temp file of a writer that is still alive."""
    from tasks.core.artifacts import write_bytes_atomic

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f".model.tmp-{gone.pid}-abc123.pt"
    live = tmp_path / f".report.tmp-{os.getpid()}-def456.json"
    for temp in (dead, live):
        temp.write_bytes(b"half")
    write_bytes_atomic(tmp_path / "other.json", b"{}")
    assert not dead.exists() and live.exists()
