"""Ships the request log and the feedback file to the bucket `serve.ship_to` names, in closed segments, so that a
monitor or retrain on another machine reads them (tasks/monitoring/window.py). The segment layout is in
tasks/core/servelog.py, the store's access in tasks/core/bucket.py.

Every `serve.ship_seconds`, a daemon thread (never the request path) closes each active file that holds lines into a
segment (RequestLog.seal) and uploads every segment not yet shipped, oldest first, then marks it shipped locally
(renamed, kept). A segment that fails to upload stays as it is and is tried again at the next round: nothing is
lost, and the round stops at the first failure (the store is down or refuses the keys: the rest would fail too).
The first round runs at start, so what a crashed process left on disk ships then.

The bound (docs/serving.md): a clean stop (SIGTERM, Ctrl-C) writes the buffers, closes the active files and ships
every segment before the process exits (unless the store refuses or is down: then they stay on disk and ship at
the next start, and the error says so). A crash of the process loses only what its buffers held (the last
`log_flush_seconds`): the rest is on disk and ships at the next start. A host lost with its disk loses at most
the rows of the last `ship_seconds + log_flush_seconds`, plus one upload's time, while the store answers.

Several processes (serve.workers) share the files: a round runs under an exclusive lock on `.<log>.ship.lock`
beside the log, so one process ships a segment once; a crash between an upload and the rename ships it again
under the same key (the key holds the digest of its bytes), which replaces the object with the same bytes."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import socket
import threading
from pathlib import Path

from serving.request_log import RequestLog
from tasks.core.bucket import BucketError, Location, put_bytes, s3_client
from tasks.core.params_spec import ServeParams
from tasks.core.servelog import FEEDBACK_KIND, SERVED_KIND, segment_key, shipped_path, stamp_of, unshipped_segments

log = logging.getLogger("torchship.serving")
DIGEST_HEX = 16   # of the segment's sha256, in its key: 64 bits, no two segments of one host collide


def host_name() -> str:
    """This host as a key part: its name, with anything but letters, digits, dots and hyphens replaced."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"


def segment_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:DIGEST_HEX]


class LogShipper:
    """Ships the closed segments of `logs` (bucket folder -> the RequestLog writing it) to `location`; a no-op when
    `location` is None (the log stays on this host)."""

    def __init__(self, logs: dict[str, RequestLog], location: Location | None, interval_s: float,
                 host: str | None = None, client_factory=s3_client):
        self.logs = {kind: request_log for kind, request_log in logs.items() if request_log.path is not None}
        self.location = location if self.logs else None
        self.interval_s = interval_s
        self.host = host or host_name()
        self.client_factory = client_factory
        self._client = None
        self._last_error = ""   # logged once, not at every round, while the store keeps failing the same way
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Ship what is on disk now (a crashed run's lines), then every `interval_s`, in a daemon thread."""
        if self.location is None:
            return
        log.info("shipping the request log and feedback to %s every %g s", self.location.url(), self.interval_s)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._ship_periodically, name="ship-logs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic rounds (the logs are then closed, and `ship_remaining()` ships what they wrote)."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None

    def ship_remaining(self) -> int:
        """The clean stop's round, after the logs were closed: waits for another worker's round, then closes the
        active files and ships every segment. Returns how many segments were shipped."""
        if self.location is None:
            return 0
        self._last_error = ""   # a failure now is said again, with what is left, even if the rounds said it
        shipped = self.ship_round(wait=True)
        if not any(unshipped_segments(request_log.path) for request_log in self.logs.values()):
            log.info("stopping: %d segment(s) shipped, nothing left on this host to ship", shipped)
        return shipped

    def ship_round(self, wait: bool = False) -> int:
        """Seal the active files and upload every unshipped segment, under the cross-process ship lock (without
        `wait`, a round another worker is running now is left to it). Returns how many segments were shipped."""
        with self._round_lock(wait) as mine:
            if not mine:
                return 0
            shipped = 0
            try:
                for request_log in self.logs.values():
                    request_log.seal()
                for kind, request_log in self.logs.items():
                    for segment in unshipped_segments(request_log.path):
                        self._ship(kind, segment)
                        shipped += 1
            except (BucketError, OSError) as exc:
                self._failed(exc)
                return shipped
            if self._last_error:
                log.info("shipping to %s works again", self.location.url())
                self._last_error = ""
            return shipped

    def _ship(self, kind: str, segment: Path) -> None:
        body = segment.read_bytes()
        key = segment_key(self.location.prefix, kind, self.host, stamp_of(segment), segment_digest(body))
        if self._client is None:
            self._client = self.client_factory()
        put_bytes(self._client, self.location, key, body)
        segment.rename(shipped_path(segment))   # after the upload: a crash in between ships it again, same key

    def _failed(self, exc: Exception) -> None:
        message = str(exc)
        if message != self._last_error:
            left = sum(len(unshipped_segments(request_log.path)) for request_log in self.logs.values())
            log.error("log shipping failed, %d segment(s) kept on this host and retried every %g s (and at the next "
                      "start): %s", left, self.interval_s, message)
        self._last_error = message

    def _ship_periodically(self) -> None:
        wait_s = 0.0   # the first round at once: what a crashed run left on disk
        while not self._stopping.wait(wait_s):
            try:
                self.ship_round()
            except Exception:   # never let the thread die: the next round tries again
                log.exception("log shipping round failed; retried in %g s", self.interval_s)
            wait_s = self.interval_s

    @contextlib.contextmanager
    def _round_lock(self, wait: bool):
        """Yields whether this process holds the ship lock of the logs' folder."""
        first = next(iter(self.logs.values())).path
        descriptor = os.open(first.with_name(f".{first.name}.ship.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(descriptor)   # closing releases the lock


def log_shipper(serve: ServeParams, served: RequestLog, feedback: RequestLog) -> LogShipper:
    """The shipper of a service's two logs to `serve.ship_to` (a no-op when it is empty or the log is off)."""
    location = Location.parse(serve.ship_to) if serve.ship_to else None
    return LogShipper({SERVED_KIND: served, FEEDBACK_KIND: feedback}, location, serve.ship_seconds)
