"""Stopping cleanly: SIGTERM becomes an exception (as Ctrl-C already is), so every `finally` that puts files
back or stops child processes runs whichever way the process is asked to stop."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM; exits with 143 (128 + SIGTERM) unless caught."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside: the first SIGTERM raises Terminated, later ones are ignored (so the clean-up it starts is not
    cut short); the previous handler is back afterwards. Only the main thread can handle signals: elsewhere
    this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_once(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
