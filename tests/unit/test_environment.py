"""The process environment every entry point sets before Prefect is imported."""
from __future__ import annotations

import os
import subprocess
import sys


def test_prefect_waits_long_enough_for_its_ephemeral_api(tmp_path):
    # Prefect's own 20 s failed whole runs on a busy 2-core box while its first start migrated the database.
    code = ("from pathlib import Path; from flows.environment import configure_environment\n"
            f"configure_environment(Path({str(tmp_path)!r}))\n"
            "from prefect.settings import get_current_settings\n"
            "print(get_current_settings().server.ephemeral.startup_timeout_seconds)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    assert int(out.strip().splitlines()[-1]) >= 120
