"""Secrets never reach logs, MLflow params, artifacts or data/: fake ones are planted where real ones live (the
admin token, MLflow's password and token, cloud keys, a DVC remote's credentials; tests/conftest.py), the session's
pipeline runs every stage with them, a copy of its project runs bless, register and a failing canary with them
(tests/reliability/conftest.py), and every file both wrote (the MLflow stores' SQLite bytes, artifacts, DVC and
Prefect state, data/) plus their console output is searched for them."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DVC_REMOTE_PASSWORD, PLANTED_IN, SECRETS

pytestmark = pytest.mark.integration


SOURCE_COPIES = (".git/", "tests/")    # the project's copy of this repository's history and tests (they name them)


def leaks(root: Path, texts: dict[str, str], secrets: list[str]) -> dict[str, list[str]]:
    """Every file under `root` (but the copies of .git and tests/, and the planted config) and every text that
    holds a secret."""
    found: dict[str, list[str]] = {}
    needles = [s.encode() for s in secrets]
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or path.is_symlink() or relative.startswith(SOURCE_COPIES) or relative == PLANTED_IN:
            continue
        if hits := [n.decode() for n in needles if n in path.read_bytes()]:
            found[relative] = hits
    for name, text in texts.items():
        if hits := [s for s in secrets if s in text]:
            found[name] = hits
    return found


def test_the_search_finds_a_planted_secret(tmp_path):
    (tmp_path / "mlflow").mkdir()
    (tmp_path / "mlflow" / "mlflow.db").write_bytes(b"\x00SQLite\x00" + SECRETS["MLFLOW_TRACKING_TOKEN"].encode())
    found = leaks(tmp_path, {"stderr": "token " + DVC_REMOTE_PASSWORD}, [*SECRETS.values(), DVC_REMOTE_PASSWORD])
    assert found == {"mlflow/mlflow.db": [SECRETS["MLFLOW_TRACKING_TOKEN"]], "stderr": [DVC_REMOTE_PASSWORD]}


@pytest.mark.xdist_group("canary_failure")   # one worker runs the failing pipeline (tests/reliability/conftest.py)
def test_planted_secrets_appear_nowhere_after_a_pipeline_run(canary_failure):
    secrets = [*SECRETS.values(), DVC_REMOTE_PASSWORD]
    assert "registered v1" in canary_failure.failed.stderr                # bless and register ran with them too
    for project, run in ((canary_failure.session_project, canary_failure.session_run),
                         (canary_failure.project, canary_failure.failed)):
        root = project.root
        assert (root / PLANTED_IN).exists()
        assert (root / "mlflow" / "mlflow.db").stat().st_size > 0 and any((root / "mlflow").rglob("*.onnx"))
        assert leaks(root, {"stdout": run.stdout, "stderr": run.stderr}, secrets) == {}, root
