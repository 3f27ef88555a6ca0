"""Child processes: copying their output while keeping its tail for error messages."""
from __future__ import annotations

import collections


def tee_lines(stream, tail: collections.deque, echo) -> None:
    """Copy a text stream to `echo`, keeping its last lines in `tail`."""
    for line in stream:
        tail.append(line.rstrip("\n"))
        echo.write(line)
        echo.flush()
