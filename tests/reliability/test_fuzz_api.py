"""The HTTP API fuzzed from its own OpenAPI document (schemathesis): the real service (`python -m serving` under
uvicorn on 127.0.0.1, admin token set, request log in a folder of its own) over the session's tiny registry.
Every operation gets bounded examples that fit its schema and examples that break it: no answer is a 5xx, every
4xx is JSON with a message (`detail`), and every 200 from /predict carries finite probabilities."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from tasks.core.procs import free_port, http_ok, start_child, wait_until_ready

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


def judge(case, response) -> str | None:
    """What is wrong with one answer, or None."""
    where = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.content[:300]!r}"
    if response.status_code >= 500 and not (case.formatted_path == "/ready" and response.status_code == 503):
        return f"server error: {where}"
    if 400 <= response.status_code < 500:
        try:
            detail = json.loads(response.content).get("detail")
        except (ValueError, AttributeError):
            return f"a 4xx without a JSON object body: {where}"
        if not detail:
            return f"a 4xx without a message: {where}"
    if response.status_code == 200 and case.formatted_path == "/predict":
        probabilities = [p for row in json.loads(response.content)["predictions"]
                         for p in row["probabilities"].values()]
        if not all(isinstance(p, float) and math.isfinite(p) for p in probabilities):
            return f"non-finite probabilities: {where}"
    return None


def test_no_operation_answers_a_5xx_and_every_4xx_says_why(service):
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{service}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {"/predict", "/feedback", "/admin/reload", "/admin/share"} <= {op.path for op in operations}
    problems: list[str] = []
    sent: dict[int, int] = {}
    with requests.Session() as session:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @settings(max_examples=EXAMPLES[mode.value], deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
                @given(case=operation.as_strategy(generation_mode=mode))
                def exchange(case):
                    response = case.call(base_url=service, session=session, timeout=30)
                    sent[response.status_code] = sent.get(response.status_code, 0) + 1
                    problem = judge(case, response)
                    if problem and len(problems) < 20:
                        problems.append(problem)

                try:
                    exchange()
                except Unsatisfiable:   # nothing to break: an operation without parameters or body
                    assert mode is GenerationMode.NEGATIVE, f"no valid request for {operation.label}"
    assert not problems, "\n".join(problems)
    assert sent.get(200, 0) >= 5 and sent.get(422, 0) >= 50, f"the fuzz reached too little: {sent}"
    print(f"fuzz: {sum(sent.values())} requests, by status {dict(sorted(sent.items()))}")

