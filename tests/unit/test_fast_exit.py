"""exit_without_teardown ends a process as a normal exit would, minus unloading modules: an idle thread pool (MLflow
uploads artifacts through one, Prefect keeps worker threads) is told to stop and joined instead of waited on forever,
exit handlers run, buffered output reaches its file, and the exit code is kept."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROGRAM = """
import atexit, sys
from concurrent.futures import ThreadPoolExecutor
from tasks.core.procs import exit_without_teardown
pool = ThreadPoolExecutor(2)
assert pool.submit(lambda: 41 + 1).result() == 42          # the pool's threads now idle, waiting for work
atexit.register(lambda: print("exit handler ran"))
print("work done", end="")                                  # still in the buffer
exit_without_teardown(int(sys.argv[1]))
"""


def test_an_idle_thread_pool_does_not_hold_the_exit_and_handlers_run():
    done = subprocess.run([sys.executable, "-c", PROGRAM, "3"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "work doneexit handler ran\n", done.stdout
