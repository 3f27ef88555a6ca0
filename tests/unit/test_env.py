"""tasks/core/env.py names every environment variable once: the copies that cannot import it match it, and no
other module spells a name out."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from tasks.core import env

REPO = Path(__file__).resolve().parents[2]
CODE = ("flows", "tasks", "serving", "models", "bench")


def known_names() -> set[str]:
    """Every variable env.py names (dict keys and *_ENV constants), and the sticky key header."""
    names = {*env.QUIET, *env.UNBUFFERED, *env.prefect_state(Path("state"))}
    names |= {value for key, value in vars(env).items() if key.endswith("_ENV") and isinstance(value, str)}
    return names | {env.PREFECT_API_URL, env.KEY_HEADER}


def spelled_out(path: Path, names: set[str]) -> list[str]:
    """`path:line name` for each string literal in `path` that is exactly one of `names`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.relative_to(REPO)}:{node.lineno} {node.value}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_no_module_but_env_spells_out_an_environment_name():
    names = known_names()
    found = [hit for folder in CODE for path in sorted((REPO / folder).rglob("*.py"))
             if path != REPO / "tasks" / "core" / "env.py" for hit in spelled_out(path, names)]
    assert not found, "import these names from tasks/core/env.py:\n" + "\n".join(found)


def test_the_check_finds_a_name_spelled_out():
    planted = REPO / "tasks" / "core" / "env.py"   # the one file where names are spelled out
    assert {"TORCHSHIP_ADMIN_TOKEN", "MLFLOW_DISABLE_TELEMETRY"} <= {hit.split()[-1] for hit in
                                                                     spelled_out(planted, known_names())}


def test_the_prefect_job_env_is_env_py_job_env():
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))
    pools = [d["work_pool"] for d in deployments["deployments"]]
    assert pools and all(pool["job_variables"]["env"] == env.JOB_ENV for pool in pools)


def test_the_makefile_exports_env_py_telemetry_switches():
    exported = [line for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
                if line.startswith("export ")]
    assert len(exported) == 1
    assert dict(re.findall(r"(\w+)=(\S+)", exported[0])) == env.TELEMETRY_OFF


def test_set_defaults_keeps_what_the_user_set():
    environ = {"DO_NOT_TRACK": "false"}
    env.set_defaults(env.TELEMETRY_OFF, environ)
    assert environ == {**env.TELEMETRY_OFF, "DO_NOT_TRACK": "false"}


def test_prefect_state_lives_in_the_given_folder(tmp_path):
    state = env.prefect_state(tmp_path)
    assert state["PREFECT_HOME"] == str(tmp_path)
    assert state["PREFECT_API_DATABASE_CONNECTION_URL"].endswith(str(tmp_path / "db" / "prefect.db"))
    assert state["PREFECT_RESULTS_DEFAULT_SERIALIZER"] == "json"   # never a pickle (test_security.py)


def test_kept_puts_a_variable_back_as_it_was_set_or_unset(monkeypatch):
    monkeypatch.setenv("TORCHSHIP_TEST_KEPT", "before")
    monkeypatch.delenv("TORCHSHIP_TEST_UNSET", raising=False)
    with env.kept("TORCHSHIP_TEST_KEPT"), env.kept("TORCHSHIP_TEST_UNSET"):
        monkeypatch.setenv("TORCHSHIP_TEST_KEPT", "during")
        monkeypatch.setenv("TORCHSHIP_TEST_UNSET", "during")
    assert env.os.environ["TORCHSHIP_TEST_KEPT"] == "before" and "TORCHSHIP_TEST_UNSET" not in env.os.environ

