"""What the user sees: rich consoles, an error they can act on as one red paragraph (exit 2), and Prefect's
logs without a traceback for such errors."""
from __future__ import annotations

import logging
from typing import NoReturn

import typer
from rich.console import Console

from tasks.core.errors import TorchshipError

console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = TorchshipError.exit_code) -> NoReturn:
    """Print `message` as one red paragraph on stderr and exit with `code`."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


class NoTracebackForUserErrors(logging.Filter):
    """Prefect logs every failed task with its traceback; for errors we explain ourselves the message is
    enough (a real bug keeps its traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], TorchshipError):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_expected_tracebacks() -> None:
    """Install the filter on Prefect's handlers (call after Prefect has configured its logging)."""
    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, NoTracebackForUserErrors) for f in handler.filters):
                handler.addFilter(NoTracebackForUserErrors())
