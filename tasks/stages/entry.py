"""The entry point shared by `python -m tasks.<stage>`: params, logging, plain errors."""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tasks.config import load_params
from tasks.core.env import STAGE_RAN_ENV, TELEMETRY_OFF, set_defaults
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params

log = logging.getLogger("torchship")


def configure_logging(level: int = logging.INFO) -> None:
    """Rich console logs for humans; quiet the chatty libraries."""
    from rich.logging import RichHandler

    logging.basicConfig(level=level, format="%(message)s", datefmt="[%X]",
                        handlers=[RichHandler(show_path=False, markup=False, rich_tracebacks=False)], force=True)
    for noisy in ("mlflow", "alembic", "great_expectations", "urllib3", "httpx", "onnxruntime", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def stage_main(stage: str, body: Callable[[Params], None]) -> None:
    """Run one stage from the command line; a TorchshipError becomes one paragraph and exit 2. A stage that
    finished ends without unloading its modules (exit_without_teardown: 1-2 CPU-s a stage that holds torch, MLflow
    and pandas, spent after its outputs are written)."""
    from tasks.core.procs import exit_without_teardown

    configure_logging()
    set_defaults(TELEMETRY_OFF)
    if os.environ.get(STAGE_RAN_ENV):   # tells tasks/stages/repro.py it ran (DVC did not restore it)
        Path(os.environ[STAGE_RAN_ENV]).touch()
    try:
        body(load_params())
    except TorchshipError as exc:
        print(f"torchship {stage} failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    exit_without_teardown(0)
