"""docs/runbooks.md: every fix command it gives (its ```sh fix blocks) is run by a test. Those that are cheap run
here, for real, on the session's tiny project: the CLI in this process (rollback, promote, plan), `torchship
monitor` as its own process (Prefect), and the curl lines with curl against a real `python -m serving`
(admin token set, request log in the project). The full pipeline re-runs (`torchship run ...`) are named below
with the tests that run them; a fix command that no test runs fails the first test."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from string import Template

import httpx
import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.core.procs import free_port, http_ok, start_child, wait_until_ready
from tasks.registry.read import CHALLENGER, CHAMPION, SHA_TAG
from tests.conftest import REPO
from tests.helpers import holdout_rows, project_registry, registry_restored

pytestmark = pytest.mark.reliability

RUNBOOK = REPO / "docs" / "runbooks.md"
MODEL = "synthetic-churn"
TOKEN = "runbook-token"
INCIDENTS = ("Out of memory", "A stuck or crashed distributed job", "A model that fails to load after an upgrade",
             "/ready answers 503", "A 5xx page", "A tail-latency spike", "A drift alert", "A bad promotion")
# Fix commands a full pipeline run would exercise (minutes each): the tests that run them, and what this module
# adds (`torchship plan` with the same overrides: the keys are valid and the stages that re-run are the ones named).
ELSEWHERE = {
    "torchship run": ("tests/integration/test_pipeline.py",
                      "test_rerun_with_nothing_changed_skips_and_registers_nothing",
                      "tests/integration/test_training_engine.py",
                      "test_kill_minus_nine_then_resume_matches_an_uninterrupted_run"),
    "torchship run --set train.batch_size=128": (
        "tests/integration/test_pipeline.py", "test_changed_params_make_a_new_version_that_is_promoted_or_rejected",
        "tests/integration/test_training_engine.py", "test_out_of_memory_halves_the_micro_batch_and_keeps_training"),
    "torchship run --set train.nproc=1": (
        "tests/integration/test_pipeline.py", "test_changed_params_make_a_new_version_that_is_promoted_or_rejected",
        "tests/integration/test_training_engine.py", "test_one_and_two_processes_reach_the_same_metric"),
}
# Fix commands that act on a Prefect server (the drift loop's schedule and trigger): the test that runs them on a
# real server, with the deployments `torchship deploy` makes from prefect.yaml.
ON_A_SERVER = ("tests/integration/test_drift_trigger.py",
               "test_the_drift_runbook_pauses_and_resumes_the_schedule_and_the_trigger")
SERVER_FIXES = {"prefect automation pause torchship-retrain-on-drift",
                "prefect deployment schedule pause torchship-monitor/monitor $SCHEDULE_ID",
                "prefect deployment schedule resume torchship-monitor/monitor $SCHEDULE_ID",
                "prefect automation resume torchship-retrain-on-drift"}
RUN_HERE = {  # fix command -> the tests of this module that run it
    "torchship rollback": ("test_a_bad_promotion_is_rolled_back_and_the_service_follows",
                           "test_a_service_without_a_loadable_champion_is_ready_again_after_a_rollback"),
    'torchship promote $VERSION --reason "v$VERSION was the last good model"':
        "test_a_bad_promotion_is_rolled_back_and_the_service_follows",
    'curl -s -X POST -H "Authorization: Bearer $TORCHSHIP_ADMIN_TOKEN" 127.0.0.1:8000/admin/reload':
        "test_a_model_that_fails_to_load_is_rolled_back_and_reloaded",
    'curl -s -X POST -H "Authorization: Bearer $TORCHSHIP_ADMIN_TOKEN" "127.0.0.1:8000/admin/share?share=0"':
        "test_a_tail_latency_spike_sends_all_traffic_to_the_champion",
    "torchship monitor --report-only": "test_a_drift_alert_is_judged_and_recorded_without_a_retrain",
}


def fix_commands() -> dict[str, list[str]]:
    """{incident title: its fix commands}, from the ```sh fix blocks under each `## ` heading."""
    found: dict[str, list[str]] = {}
    for section in re.split(r"^## ", RUNBOOK.read_text(), flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        blocks = re.findall(r"^```sh fix\n(.*?)^```", body, flags=re.M | re.S)
        found[title.strip()] = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    return found


def test_every_fix_command_in_the_runbooks_is_run_by_a_test():
    commands = fix_commands()
    assert [t for t in INCIDENTS if not any(title.startswith(t) for title in commands)] == [], list(commands)
    assert all(commands.values()), {title: fixes for title, fixes in commands.items() if not fixes}
    here = set(dir(sys.modules[__name__]))
    for title, fixes in commands.items():
        for command in fixes:
            if command in RUN_HERE:
                named = RUN_HERE[command]
                assert set([named] if isinstance(named, str) else named) <= here, command
                continue
            if command in SERVER_FIXES:
                file, test = ON_A_SERVER
                assert f"def {test}(" in (REPO / file).read_text(), f"{file}::{test} is gone"
                continue
            assert command in ELSEWHERE, f"{title}: no test runs the fix command `{command}`"
            named = ELSEWHERE[command]
            for file, test in zip(named[::2], named[1::2]):
                assert f"def {test}(" in (REPO / file).read_text(), f"{file}::{test} is gone"
    assert "runbooks.md" in (REPO / "README.md").read_text(), "the README does not link the runbooks"


def run_fix(command: str, served: Served, **values: str) -> str:
    """Run one fix command as the runbook writes it (placeholders filled in) in the project; its output."""
    filled = Template(command).substitute({"TORCHSHIP_ADMIN_TOKEN": TOKEN, **values})
    argv = shlex.split(filled.replace("127.0.0.1:8000", served.url.removeprefix("http://")))
    if argv[0] == "curl":
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed: the runbook's HTTP fixes are curl lines")
        result = subprocess.run(["curl", "--fail-with-body", *argv[1:]], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{filled}: {result.stdout} {result.stderr}"
        return result.stdout
    assert argv[0] == "torchship"
    if argv[1] == "monitor":   # runs a Prefect flow: a process of its own, as a user runs it
        result = served.project.torchship(*argv[1:], timeout=600)
        assert result.returncode == 0, f"{filled}: {result.stdout[-2000:]} {result.stderr[-2000:]}"
        return result.stdout
    saved, cwd = dict(os.environ), os.getcwd()
    try:
        os.chdir(served.project.root)
        result = CliRunner().invoke(app, argv[1:])
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
    assert result.exit_code == 0, f"{filled}: {result.output}"
    return result.stdout


class Served:
    """The tiny project, a service on it and an MLflow client of its registry."""

    def __init__(self, project, url: str, child, client):
        self.project, self.url, self.child, self.client = project, url, child, client

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()

    def wait_for(self, champion: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.health()["champion"] != champion:
            assert time.monotonic() < deadline, f"the service serves v{self.health()['champion']}, not v{champion}"
            time.sleep(0.1)

    def champion(self) -> str:
        return str(self.client.get_model_version_by_alias(MODEL, CHAMPION).version)

    def promote_by_hand(self, version: str, reason: str) -> None:
        """The incident: a promotion someone made (forced: a hand-registered version carries no bless tag)."""
        run_fix(f'torchship promote {version} --reason "{reason}" --force', self)

    def register_copy(self, sha256: str | None = None) -> str:
        """A new version of the champion's own artifact (no upload), as a hand registration makes one; tagged
        with its sha256, or with `sha256` (a wrong one: the service refuses to load it)."""
        champion = self.client.get_model_version_by_alias(MODEL, CHAMPION)
        files = self.client.get_model_version_download_uri(MODEL, champion.version)   # in the project's store
        version = self.client.create_model_version(MODEL, source=files, run_id=champion.run_id).version
        self.client.set_model_version_tag(MODEL, version, SHA_TAG, sha256 or champion.tags[SHA_TAG])
        return str(version)


@pytest.fixture(scope="module")
def served(tiny_pipeline, tmp_path_factory):
    """A service on the tiny project (its request log where the monitor reads it); afterwards the registry's
    aliases, tags and versions and the project's loop state are as they were."""
    project, _ = tiny_pipeline
    loop_state = [project.root / "data" / name for name in ("serve", "monitor")]
    kept = tmp_path_factory.mktemp("loop-state")
    for folder in loop_state:
        if folder.exists():
            shutil.copytree(folder, kept / folder.name)
    client = project_registry(project)
    port = free_port()
    child = start_child("service", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", MODEL,
                                    "--poll-seconds", "0.2"], kept / "service.log", cwd=project.root,
                        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
                             "TORCHSHIP_ADMIN_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}"
    try:
        with registry_restored(client, MODEL):
            try:
                wait_until_ready(child, http_ok(f"{url}/ready"), timeout=90)
                yield Served(project, url, child, client)
            finally:
                child.stop()
    finally:
        for folder in loop_state:
            shutil.rmtree(folder, ignore_errors=True)
            if (kept / folder.name).exists():
                shutil.copytree(kept / folder.name, folder)


def test_a_bad_promotion_is_rolled_back_and_the_service_follows(served):
    good = served.champion()
    bad = served.register_copy()
    served.promote_by_hand(bad, "looked fine in review")
    served.wait_for(bad)
    said = run_fix("torchship rollback", served)
    assert f"v{good} again" in said and f"v{bad} tagged rejected" in said
    served.wait_for(good)
    served.promote_by_hand(bad, "tried again")   # and once more by hand; this time promote the good one back
    served.wait_for(bad)
    run_fix('torchship promote $VERSION --reason "v$VERSION was the last good model"', served, VERSION=good)
    assert served.champion() == good
    served.wait_for(good)
    assert f"v{good} was the last good model" in served.client.get_model_version(MODEL, good).tags["promoted"]


def test_a_model_that_fails_to_load_is_rolled_back_and_reloaded(served):
    good = served.champion()
    broken = served.register_copy(sha256="0" * 64)   # its bytes do not match its tag: refused, as a broken file is
    served.promote_by_hand(broken, "the upgrade's first model")
    deadline = time.monotonic() + 60
    while f"could not load champion v{broken}" not in served.child.output_tail(50_000):
        assert time.monotonic() < deadline, served.child.output_tail()
        time.sleep(0.1)
    assert served.health()["champion"] == good, "the refused version replaced the champion"
    run_fix("torchship rollback", served)
    assert served.champion() == good
    reloaded = run_fix('curl -s -X POST -H "Authorization: Bearer $TORCHSHIP_ADMIN_TOKEN" 127.0.0.1:8000/admin/reload',
                       served)
    assert f'"champion":"{good}"' in reloaded.replace(" ", "")


def test_a_service_without_a_loadable_champion_is_ready_again_after_a_rollback(served, tmp_path):
    """A service started while champion names a version it refuses: /ready and /predict answer 503 (the
    `unavailable` 5xx the error page counts) until the runbook's rollback, then 200 without a restart."""
    good = served.champion()
    broken = served.register_copy(sha256="0" * 64)
    served.promote_by_hand(broken, "a hand-registered upgrade")
    port = free_port()
    fresh = start_child("fresh service", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", MODEL,
                                          "--poll-seconds", "0.2"], tmp_path / "fresh.log", cwd=served.project.root,
                        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    row = holdout_rows(served.project)[0]
    try:
        refused = f"could not load champion v{broken}"   # logged before the service listens: wait for both
        wait_until_ready(fresh, lambda: refused in fresh.output_tail(50_000) and httpx.get(f"{url}/ready", timeout=5)
                         .status_code in (200, 503), timeout=90)
        ready = httpx.get(f"{url}/ready", timeout=30)
        assert ready.status_code == 503 and ready.json()["status"] == "no-model", ready.text
        assert httpx.post(f"{url}/predict", json={"rows": [row]}, timeout=30).status_code == 503
        assert 'status="unavailable"' in httpx.get(f"{url}/metrics", timeout=30).text
        run_fix("torchship rollback", served)
        wait_until_ready(fresh, http_ok(f"{url}/ready", lambda health: health["champion"] == good), timeout=60)
        assert httpx.post(f"{url}/predict", json={"rows": [row]}, timeout=30).json()["version"] == good
    finally:
        fresh.stop()


def test_a_tail_latency_spike_sends_all_traffic_to_the_champion(served):
    challenger = served.register_copy()
    served.client.set_registered_model_alias(MODEL, CHALLENGER, challenger)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    shared = httpx.post(f"{served.url}/admin/share", params={"share": 0.5}, headers=headers, timeout=60)
    assert shared.status_code == 200
    deadline = time.monotonic() + 60
    while served.health()["challenger"] != challenger:
        assert time.monotonic() < deadline, served.health()
        time.sleep(0.1)
    run_fix('curl -s -X POST -H "Authorization: Bearer $TORCHSHIP_ADMIN_TOKEN" "127.0.0.1:8000/admin/share?share=0"',
            served)
    assert served.health()["challenger_share"] == 0
    row = holdout_rows(served.project)[0]
    with httpx.Client(base_url=served.url, timeout=30) as http:
        variants = {http.post("/predict", json={"rows": [row]}).json()["variant"] for _ in range(40)}
    assert variants == {"champion"}
    served.client.delete_registered_model_alias(MODEL, CHALLENGER)


def test_a_drift_alert_is_judged_and_recorded_without_a_retrain(served):
    versions = {v.version for v in served.client.search_model_versions(f"name='{MODEL}'")}
    rows = holdout_rows(served.project, 100)
    with httpx.Client(base_url=served.url, timeout=30) as http:
        for start in range(0, len(rows), 20):
            assert http.post("/predict", json={"rows": rows[start:start + 20]}).status_code == 200
    log = served.project.root / "data/serve/requests.jsonl"
    deadline = time.monotonic() + 30
    while not log.exists() or len(log.read_text().splitlines()) < len(rows):   # written every serve.log_flush_seconds
        assert time.monotonic() < deadline, "the served rows did not reach the request log"
        time.sleep(0.1)
    said = run_fix("torchship monitor --report-only", served)
    assert "drift gate" in said and "trigger" in said, said
    assert "retrain:" not in said
    decisions = (served.project.root / "data/monitor/decisions.jsonl").read_text().splitlines()
    assert decisions, "the decision was not recorded"
    assert {v.version for v in served.client.search_model_versions(f"name='{MODEL}'")} == versions


def test_the_pipeline_fixes_name_valid_overrides_and_the_stages_they_rerun(served):
    """The `torchship run --set ...` fixes (run for real by the tests ELSEWHERE names): their overrides are
    valid keys, and the plan re-runs training and what follows, nothing before it."""
    overrides = sorted({arg for command in ELSEWHERE for arg in shlex.split(command)[2:] if arg != "--set"})
    assert overrides == ["train.batch_size=128", "train.nproc=1"]
    said = run_fix(f"torchship plan {' '.join(f'--set {o}' for o in overrides)}", served)
    lines = {line.split("│")[1].strip(): line for line in said.splitlines() if line.count("│") >= 3}
    assert "run" in lines["train"] and "train.batch_size: 256 -> 128" in said, said
