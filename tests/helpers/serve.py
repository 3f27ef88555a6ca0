"""`torchship serve` on a test project, as a user starts it: the request log on, the admin token set, the project's
venv first on PATH and none of the test process's Prefect, MLflow or pytest settings."""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from tasks.core.env import TOKEN_ENV
from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready

BIN = Path(sys.executable).parent


@contextlib.contextmanager
def serving(root: Path, log_folder: Path, token: str, champion: str = "1") -> Iterator[str]:
    """The service's URL once it serves `champion`; stopped on the way out, and its output held to no traceback."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", **{TOKEN_ENV: token})
    child = start_child("torchship serve", [str(BIN / "torchship"), "serve", "--port", str(port)],
                        log_folder / "serve.log", env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    with running([child]):
        wait_until_ready(child, http_ok(f"{url}/health", lambda body: body.get("champion") == champion), 120)
        yield url
    assert "Traceback" not in child.output_tail(100_000), child.output_tail()
