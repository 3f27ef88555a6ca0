"""Stopping cleanly: SIGTERM becomes an exception (as Ctrl-C already is), so every `finally` that puts files
back or stops child processes runs whichever way the process is asked to stop. The mechanism lives with the
child processes (tasks.core.procs: `running` stops its children on SIGTERM too); commands import it here."""
from __future__ import annotations

from tasks.core.procs import Terminated, sigterm_raises

__all__ = ["Terminated", "sigterm_raises"]
