"""The HTTP API fuzzed from its own OpenAPI document (schemathesis): bounded examples that fit each operation's schema
and examples that break it, every answer judged (tests/reliability/test_fuzz_api.py on a table model,
tests/reliability/test_fuzz_images.py on an image model, in memory)."""
from __future__ import annotations

import json
import math

import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable


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


def fuzz_operations(url: str, paths: set[str] | None = None, positive: int = 60, negative: int = 30
                    ) -> tuple[dict[int, int], list[str]]:
    """(answers by status, up to 20 problems) of fuzzing the service at `url` (the operations on `paths`, or all)."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    operations = [op for op in operations if paths is None or op.path in paths]
    examples = {GenerationMode.POSITIVE: positive, GenerationMode.NEGATIVE: negative}
    problems: list[str] = []
    sent: dict[int, int] = {}
    with requests.Session() as session:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @settings(max_examples=examples[mode], deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
                @given(case=operation.as_strategy(generation_mode=mode))
                def exchange(case):
                    response = case.call(base_url=url, session=session, timeout=30)
                    sent[response.status_code] = sent.get(response.status_code, 0) + 1
                    problem = judge(case, response)
                    if problem and len(problems) < 20:
                        problems.append(problem)

                try:
                    exchange()
                except Unsatisfiable:   # nothing to break: an operation without parameters or body
                    assert mode is GenerationMode.NEGATIVE, f"no valid request for {operation.label}"
    return sent, problems
