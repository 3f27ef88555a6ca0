"""A buffered, rotated JSON-lines appender: the service's request log (served rows, the drift monitor's input)
and the feedback file beside it. The line format lives in tasks/core/servelog.py."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from tasks.core.servelog import STAMP, rotated_path, shipped_path

log = logging.getLogger("torchship.serving")


class RequestLog:
    """Appends JSON lines to `path` through an in-memory buffer; a no-op when `path` is None (the canary's
    service runs without a log).

    `append()` only adds to the buffer under a lock: a request never waits on the disk. A daemon thread
    writes the buffer every `flush_seconds` (one write, then a flush to the OS). Before a write it rotates
    the active file when the file is larger than `rotate_bytes` or was opened more than `rotate_seconds`
    ago: the file is renamed to `<stem>-<UTC time>.jsonl` beside it and a fresh one is opened.

    Several processes (serve.workers) may log to the same path: each write, and each rotation, happens under an
    exclusive lock on `.<name>.lock` beside the file, and a process whose file was rotated by another one reopens
    the fresh file before it writes (so lines never interleave and never go to a rotated file late).

    Guarantee: `close()` (a clean shutdown) writes every line appended before it. A crash of the process
    loses at most the lines appended in the last `flush_seconds`; written lines are handed to the OS but
    not fsynced, so a crash of the machine may lose what the OS had not yet put on disk. A write that
    fails (disk full) is logged and its lines are dropped: the service keeps answering, and the file is cut back
    to where that write began, so it never ends in half a line that the next write would run into."""

    def __init__(self, path: Path | None, flush_seconds: float = 1.0, rotate_bytes: int = 64 << 20,
                 rotate_seconds: float = 24 * 3600.0, clock: Callable[[], float] = time.time):
        self.path = path
        self.flush_seconds = flush_seconds
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.clock = clock   # wall-clock seconds: the age of the active file and the rotated file's name
        # Appended, not yet written: one growing buffer (a flush hands it over whole and starts a new one, so a
        # second's worth of lines is held once, not as many small strings plus their joined copy).
        self._pending = bytearray()
        self._buffer_lock = threading.Lock()   # held only to append or swap the buffer: never around I/O
        self._write_lock = threading.Lock()    # one writer at a time, so lines reach the file in append order
        self._handle: BinaryIO | None = None
        self._lock_file: int | None = None   # the fd flock'ed around each write, across processes
        self._opened_at = 0.0
        self._accepting = False
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None

    def open(self) -> None:
        """Open (or create) the active file and start the flusher. Opening here, not at the first write,
        makes an unwritable path fail the service's start instead of every later flush."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        with self._write_lock, self._across_processes():
            self._open_active()
        with self._buffer_lock:
            self._accepting = True
        self._stopping.clear()
        self._flusher = threading.Thread(target=self._flush_periodically, name=f"flush-{self.path.name}",
                                         daemon=True)
        self._flusher.start()

    def append(self, lines: str | bytes) -> None:
        """Buffer complete lines (each ending in a newline; text or UTF-8); dropped unless the log is open."""
        data = lines.encode("utf-8") if isinstance(lines, str) else lines
        with self._buffer_lock:
            if self._accepting:
                self._pending += data

    def flush(self) -> None:
        """Write what is buffered now (the flusher calls this every `flush_seconds`)."""
        with self._write_lock:  # the swap under it too: a later swap can never be written before an earlier one
            with self._buffer_lock:
                data, self._pending = self._pending, bytearray()
            if not data:
                return
            try:
                self._write(data)
            except OSError as exc:
                log.error("could not write %d line(s) to %s, dropped: %s", data.count(b"\n"), self.path, exc)

    def close(self) -> None:
        """Stop the flusher, write everything buffered and close the file."""
        with self._buffer_lock:
            self._accepting = False
        if self._flusher is not None:
            self._stopping.set()
            self._flusher.join()
            self._flusher = None
        self.flush()
        with self._write_lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            if self._lock_file is not None:
                os.close(self._lock_file)
                self._lock_file = None

    def seal(self) -> None:
        """Rotate the active file now when it holds lines, open or closed (serving/shipper.py ships closed segments
        only: this bounds how long a line waits to be shipped, whatever the traffic)."""
        if self.path is None:
            return
        with self._write_lock, self._across_processes():
            if self._handle is not None:
                if self._rotated_by_another():
                    self._handle.close()
                    self._open_active()
                if os.fstat(self._handle.fileno()).st_size > 0:
                    self._rotate()
            elif self.path.exists() and self.path.stat().st_size > 0:
                self.path.rename(self._rotated_name())

    def _flush_periodically(self) -> None:
        while not self._stopping.wait(self.flush_seconds):
            self.flush()

    @contextlib.contextmanager
    def _across_processes(self):
        if self._lock_file is None:   # closed: a seal after close() still excludes the other workers
            with held_lock(self.path):
                yield
            return
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def _write(self, data: bytes) -> None:
        with self._across_processes():
            if self._handle is not None and self._rotated_by_another():
                self._handle.close()
                self._open_active()
            self._write_locked(data)

    def _rotated_by_another(self) -> bool:
        """The path no longer names the file this process has open (another process renamed it away)."""
        try:
            return os.stat(self.path).st_ino != os.fstat(self._handle.fileno()).st_ino
        except FileNotFoundError:
            return True

    def _write_locked(self, data: bytes) -> None:
        if self._handle is not None and self._rotation_due():
            try:
                self._rotate()
            except OSError as exc:  # a failed rotation must not lose the lines: they go to the active file
                log.error("could not rotate %s, writing on to it: %s", self.path, exc)
        if self._handle is None:  # the last rotation could not reopen the file: once more, else these lines drop
            self._open_active()
        start = os.fstat(self._handle.fileno()).st_size   # the end: we append, under the cross-process lock
        try:
            view = memoryview(data)
            while view:   # unbuffered: a short write (a file-size limit) returns what it wrote, the rest is retried
                view = view[self._handle.write(view):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._handle.fileno(), start)
            raise

    def _open_active(self) -> None:
        self._handle = None   # not the closed one, should the open fail
        self._handle = self.path.open("ab", buffering=0)   # nothing held back in a buffer after a failed write
        self._opened_at = self.clock()

    def _rotation_due(self) -> bool:
        size = os.fstat(self._handle.fileno()).st_size
        return size > 0 and (size > self.rotate_bytes or self.clock() - self._opened_at > self.rotate_seconds)

    def _rotate(self) -> None:
        target = self._rotated_name()
        self._handle.close()
        try:
            self.path.rename(target)
            log.info("rotated %s to %s", self.path, target.name)
        finally:
            self._open_active()   # the fresh file, or the same one again when the rename failed

    def _rotated_name(self) -> Path:
        """`<stem>-<UTC second>.jsonl`; a second rotation within the same second gets a counter after the
        stamp (`...Z01`), which still sorts after the first and before the next second."""
        stamp = datetime.fromtimestamp(self.clock(), UTC).strftime(STAMP)
        target, count = rotated_path(self.path, stamp), 0
        while target.exists() or shipped_path(target).exists():   # a shipped segment keeps its stamp
            count += 1
            target = rotated_path(self.path, f"{stamp}{count:02d}")
        return target


def lock_path(path: Path) -> Path:
    """The file flock'ed around each write and rotation of `path`, by every process that logs to it."""
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def held_lock(path: Path):
    """The cross-process lock of `path`, taken on a descriptor of its own."""
    descriptor = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)   # closing releases the lock
