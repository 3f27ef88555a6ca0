"""The HTTP API fuzzed from its own OpenAPI document (schemathesis): the real service (`python -m serving` under
uvicorn on 127.0.0.1, admin token set, request log in a folder of its own) over the session's tiny registry.
Every operation gets bounded examples that fit its schema and examples that break it: no answer is a 5xx, every
4xx is JSON with a message (`detail`), and every 200 from /predict carries finite probabilities."""
from __future__ import annotations

import os
import sys

import pytest

from tasks.core.procs import free_port, http_ok, start_child, wait_until_ready
from tests.helpers.fuzz import fuzz_operations

pytestmark = pytest.mark.reliability

MODEL = "synthetic-churn"
EXAMPLES = {"positive": 60, "negative": 30}   # at most, per operation (~300 requests in all: small operations run out)


@pytest.fixture(scope="module")
def service(tiny_pipeline, tmp_path_factory):
    """The base URL of a running service; its output is checked for tracebacks when it stops."""
    project, _ = tiny_pipeline
    folder = tmp_path_factory.mktemp("fuzz")
    port = free_port()
    child = start_child("service", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", MODEL,
                                    "--request-log", str(folder / "requests.jsonl"), "--poll-seconds", "30"],
                        folder / "service.log", cwd=project.root,
                        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
                             "TORCHSHIP_ADMIN_TOKEN": "fuzz-token-never-guessed"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(child, http_ok(f"{url}/ready"), timeout=90)
        yield url
    finally:
        child.stop()
    assert "Traceback" not in child.output_tail(200_000), child.output_tail()


def test_no_operation_answers_a_5xx_and_every_4xx_says_why(service):
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{service}/openapi.json")
    assert {"/predict", "/feedback", "/admin/reload", "/admin/share"} <= {
        result.ok().path for result in schema.get_all_operations()}
    sent, problems = fuzz_operations(service, positive=EXAMPLES["positive"], negative=EXAMPLES["negative"])
    assert not problems, "\n".join(problems)
    assert sent.get(200, 0) >= 5 and sent.get(422, 0) >= 50, f"the fuzz reached too little: {sent}"
    print(f"fuzz: {sum(sent.values())} requests, by status {dict(sorted(sent.items()))}")
