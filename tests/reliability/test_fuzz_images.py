"""An image model's /predict and /feedback fuzzed in memory (the whole ASGI app, lifespan included, on a small served
image model; the real process adds nothing here): schemathesis from the app's own OpenAPI document, and a mutating
image generator (PNG in each mode, 16-bit, JPEG, CMYK, MPO, EXIF-rotated, animated PNG and GIF, TIFF; bytes flipped,
cut short, a header claiming a huge size, junk appended), sent as JSON base64 (sometimes line-wrapped) and as
multipart uploads. A fixed number of examples, a fixed seed, a time cap. No answer is a 5xx, every 4xx says why, and
the process's peak memory grows by no more than the bound docs/reliability.md states for the limits served with."""
from __future__ import annotations

import asyncio
import base64
import json
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from serving.app import create_app
from serving.service import ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape, image_shape
from tasks.modalities.image.settings import ImagesParams
from tests.helpers.image_kinds import KINDS, MUTATIONS, image_file, mutated
from tests.helpers.images import served_image_model

pytestmark = pytest.mark.reliability

SCHEMA = Schema(source="t", target="label", classes=["circle", "cross", "square"], modality="image",
                inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())
# The per-image limit raised to 1 M pixels (the default would be 64x the model's 256), so large images are decoded
IMAGES = ImagesParams(serve_pixels_factor=4096.0)
SERVE = ServeParams(request_log="", max_decodes=2)
MUTANTS, SEED, TIME_CAP_S = 120, 40, 45.0
EXAMPLES = {"positive": 20, "negative": 20}   # schemathesis's, per operation
DECODE_BYTES_PER_PIXEL = 8   # docs/reliability.md: a decode holds at most this per pixel of the per-image limit
BODY_COPIES = 3              # ... and a body at most this many times over while it is parsed (bytes, text, files)
HARNESS_MB = 64              # what the in-process harness itself may allocate meanwhile (hypothesis, clients)


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """The app over a model file, with a request log named so /feedback judges labels (a model-file service keeps no
    log: its lines are dropped, never written)."""
    folder = tmp_path_factory.mktemp("fuzz-images")
    model = served_image_model(folder, SCHEMA)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ServiceSettings, "request_log", property(lambda settings: folder / "requests.jsonl"))
        yield create_app(ServiceSettings(serve=SERVE, model_name="m", tracking=TrackingParams(), model_file=model,
                                         host={"images": IMAGES.model_dump()}))


def peak_growth_mb(since_kb: int) -> float:
    """The process's peak RSS since `reset_peak` less the RSS it had then, in MB."""
    lines = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(line.split()[1]) for line in lines if line.startswith("VmHWM:"))
    return (peak - since_kb) / 1024


def reset_peak() -> int:
    """The RSS now (KiB), with the kernel's peak RSS reset to it (clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")
    lines = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith("VmRSS:"))


def memory_bound_mb() -> float:
    """docs/reliability.md's bound for these limits: the concurrent decodes at their per-image limit, a body being
    parsed, and the harness."""
    pixels = min(IMAGES.max_pixels, IMAGES.serve_pixels_factor * image_shape(SCHEMA).height * image_shape(SCHEMA).width)
    decodes = SERVE.max_decodes * DECODE_BYTES_PER_PIXEL * pixels
    return (decodes + BODY_COPIES * SERVE.max_body_mb * (1 << 20)) / 1e6 + HARNESS_MB


def request(rng: np.random.Generator) -> dict:
    """httpx keyword arguments of one mutated image request: 1 to 3 files, as JSON base64 or a multipart upload."""
    files = []
    for _ in range(int(rng.integers(1, 4))):
        side = int(rng.choice([4, 16, 33, 64, 700]))   # 700 x 700: over the model's size, reduced before decoding
        data = image_file(str(rng.choice(KINDS)), side, int(rng.integers(3, 90)), seed=int(rng.integers(1 << 30)),
                          orientation=int(rng.integers(1, 9)))
        files.append(mutated(data, str(rng.choice(MUTATIONS, p=[0.3, 0.2, 0.2, 0.15, 0.15])), rng))
    if rng.random() < 0.5:
        encoded = [base64.b64encode(f).decode() for f in files]
        if rng.random() < 0.3:
            encoded = ["\n".join(textwrap.wrap(text, 76)) for text in encoded]
        return {"content": json.dumps({"images": encoded}).encode(), "headers": {"content-type": "application/json"}}
    boundary = "fuzz-boundary"
    body = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{i}"\r\n\r\n'.encode()
                    + f + b"\r\n" for i, f in enumerate(files)) + f"--{boundary}--\r\n".encode()
    kind = str(rng.choice(["multipart/form-data", "Multipart/Form-Data"]))
    return {"content": body, "headers": {"content-type": f"{kind}; boundary={boundary}"}}


def judged(status: int, content: bytes, what: str) -> str | None:
    if status >= 500:
        return f"{what} -> {status}: {content[:300]!r}"
    if 400 <= status < 500 and not json.loads(content).get("detail"):
        return f"{what} -> {status} without a message"
    return None


async def send_mutants(front) -> tuple[dict[int, int], list[str]]:
    rng, started = np.random.default_rng(SEED), time.monotonic()
    sent: dict[int, int] = {}
    problems: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://service") as client:
        for index in range(MUTANTS):
            if time.monotonic() - started > TIME_CAP_S:
                break
            response = await client.post("/predict", **request(rng))
            sent[response.status_code] = sent.get(response.status_code, 0) + 1
            problem = judged(response.status_code, response.content, f"mutant {index}")
            if problem:
                problems.append(problem)
    return sent, problems


def fuzz_schema(front) -> tuple[dict[int, int], list[str]]:
    """schemathesis over /predict and /feedback, from the app's own document, in memory."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    from tests.helpers.fuzz import judge

    schema = schemathesis.openapi.from_asgi("/openapi.json", front)
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().path in ("/predict", "/feedback")]
    assert {op.path for op in operations} == {"/predict", "/feedback"}
    sent: dict[int, int] = {}
    problems: list[str] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES[mode.value], deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def exchange(case):
                response = case.call()
                sent[response.status_code] = sent.get(response.status_code, 0) + 1
                problem = judge(case, response)
                if problem:
                    problems.append(problem)

            try:
                exchange()
            except Unsatisfiable:   # nothing breaks a body of any JSON (/feedback's): no negative example
                assert mode is GenerationMode.NEGATIVE, f"no valid request for {operation.label}"
    return sent, problems


def test_the_image_endpoint_and_feedback_answer_no_5xx_and_stay_in_memory(front):
    import schemathesis  # noqa: F401 - imported before the peak is reset: a library's import is no request's memory
    from fastapi.testclient import TestClient

    with TestClient(front):   # the lifespan: the model loads (no request's memory: the peak is reset after it)
        since = reset_peak()
        sent, problems = asyncio.run(send_mutants(front))
        schema_sent, schema_problems = fuzz_schema(front)
    growth = peak_growth_mb(since)
    assert not problems + schema_problems, "\n".join((problems + schema_problems)[:20])
    assert sum(sent.values()) >= 40, f"the time cap left too few mutants: {sent}"
    assert sent.get(200, 0) >= 10 and sent.get(413, 0) >= 5 and sent.get(422, 0) >= 10, sent
    assert schema_sent.get(422, 0) >= 10, schema_sent   # random bytes as base64 are no image: 422, never a 200
    assert growth < memory_bound_mb(), f"peak RSS grew {growth:.0f} MB, over the bound {memory_bound_mb():.0f} MB"
    print(f"fuzz: mutants by status {dict(sorted(sent.items()))}, schemathesis {dict(sorted(schema_sent.items()))}, "
          f"peak RSS +{growth:.0f} MB (bound {memory_bound_mb():.0f} MB)")
