"""The registry watcher: a child process that follows the aliases and hands the service verified model bytes.

Everything that talks to MLflow runs here, not in the serving process: importing MLflow and opening its store
costs the server ~170 MiB of resident memory, and each poll holds the GIL for tens of milliseconds (p99 on the
event loop). The child polls every `poll_seconds` (or when asked), and for each alias whose version moved sends
the version's ONNX bytes, checked against its `artifact_sha256` tag (tasks.registry.read.verified_onnx), or
the reason it was refused; the server only opens and warms what it receives. Each version is sent once until
its alias moves or a poll asks to retry (/admin/reload). When an alias moved, the child also records the move in
the alias history if nobody did (a move in the MLflow UI: tasks/registry/history.py), and says whether the
champion is one bless did not pass; a history it cannot write now is retried at the next poll, and never stops
the serving.

Messages, child -> server: ("version", alias, version, bytes) | ("refused", alias, version, reason) |
("gone", alias) | ("champion", version, concern or None) | ("failed", reason) | ("polled", token).
Server -> child: ("poll", token, retry) | ("stop",).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
from collections.abc import Callable

from tasks.core.params_spec import TrackingParams
from tasks.registry.read import CHALLENGER, CHAMPION

log = logging.getLogger("torchship.serving")
ALIASES = (CHAMPION, CHALLENGER)
HISTORY_LOCK_WAIT_S = 2.0   # the registry lock is held for a move's few writes; busier than this: the next poll


def watch(tracking: dict, name: str, poll_seconds: float, conn) -> None:
    """The child's loop (until told to stop, or the server goes away)."""
    from tasks.registry.history import champion_concern, record_outside_moves
    from tasks.registry.read import alias_version, registry_client, verified_onnx

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client = registry_client(TrackingParams.model_validate(tracking))
    sent: dict[str, str | None] = {}   # alias -> the version last sent (served or refused)
    observer = f"the service's registry watcher (pid {os.getpid()} on {socket.gethostname()})"
    unrecorded = retrying = False      # an alias moved and the history could not be written yet
    while True:
        try:
            message = conn.recv() if conn.poll(poll_seconds) else ("poll", None, False)
        except (EOFError, OSError):   # the server is gone
            return
        if message[0] == "stop":
            return
        _, token, retry = message
        if retry:
            sent.clear()
        try:
            for alias in ALIASES:
                moved = alias_version(client, name, alias)
                version = None if moved is None else str(moved.version)
                if sent.get(alias, "") == version:
                    continue
                sent[alias] = version
                unrecorded = True
                if alias == CHAMPION:
                    conn.send(("champion", version, champion_concern(moved.tags) if moved else None))
                if version is None:
                    conn.send(("gone", alias))
                    continue
                try:
                    conn.send(("version", alias, version, verified_onnx(client, name, version)))
                except Exception as exc:   # tampered, untagged, not downloadable: the server says so
                    conn.send(("refused", alias, version, str(exc)))
        except Exception as exc:   # the registry may be briefly unreachable: the next poll retries
            conn.send(("failed", str(exc)))
        if unrecorded:
            try:
                record_outside_moves(client, name, observer, HISTORY_LOCK_WAIT_S)
                unrecorded = False
            except Exception as exc:   # the lock busy, the store read-only to this service: serving goes on
                if not retrying:       # once per streak: a read-only store would say it at every poll
                    log.warning("alias history not written (each poll retries; the monitor records it too): %s",
                                exc)
            retrying = unrecorded
        if token is not None:
            conn.send(("polled", token))


class RegistryWatcher:
    """The server's side: starts the child, hands each message to `on_message` in a reader thread, and lets a
    caller ask for a poll and wait until its results have been handled."""

    def __init__(self, tracking: TrackingParams, name: str, poll_seconds: float,
                 on_message: Callable[[tuple], None]):
        self.tracking, self.name, self.poll_seconds = tracking, name, poll_seconds
        self.on_message = on_message
        self._conn = None
        self._child = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._waiting: dict[int, threading.Event] = {}
        self._tokens = 0

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")   # a fresh interpreter: no threads or loop of ours inside
        self._conn, child_conn = context.Pipe()
        self._child = context.Process(target=watch, name="registry-watcher", daemon=True,
                                      args=(self.tracking.model_dump(), self.name, self.poll_seconds, child_conn))
        self._child.start()
        child_conn.close()
        self._reader = threading.Thread(target=self._read, name="registry-reader", daemon=True)
        self._reader.start()

    def poll(self, retry: bool = False, timeout: float = 300.0) -> bool:
        """Ask for a poll now; True once its results are handled (False on timeout or a dead child)."""
        with self._send_lock:
            self._tokens += 1
            token, done = self._tokens, threading.Event()
            self._waiting[token] = done
            try:
                self._conn.send(("poll", token, retry))
            except OSError:
                return False
        return done.wait(timeout)

    def stop(self, timeout: float) -> None:
        if self._child is None:
            return
        with self._send_lock:
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
        self._child.join(timeout)
        if self._child.is_alive():
            self._child.terminate()
            self._child.join(timeout)
        self._conn.close()
        if self._reader is not None:
            self._reader.join(timeout)
        self._child = self._reader = None

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):   # the child exited (stop, or a crash: polls then time out)
                for done in self._waiting.values():
                    done.set()
                return
            if message[0] == "polled":
                self._waiting.pop(message[1], threading.Event()).set()
                continue
            try:
                self.on_message(message)
            except Exception:   # a bug must not kill the reader: later swaps still arrive
                log.exception("registry message %s failed", message[:3])
