"""An image model's service against the request that stalled it: a 6,300 x 6,300 all-black PNG (a 38 KB file, 40 M
pixels), the real service (`python -m serving --model-file`, uvicorn on 127.0.0.1) over a small served image model.

- refused (this tree's defaults): the PNG alone (JSON base64) and a hundred of it in one multipart body (under the
  4 MiB body limit) are refused unread with 413; figures: the time to the refusal (median of ROUNDS) and the
  service's peak RSS growth over them.
- decoded (this tree, `images.serve_pixels_factor` raised so the PNG is decoded): /health is polled while the PNG
  decodes; figures: the decode request's time, /health's latency (median and worst) during it, peak RSS growth.
- before (with --baseline DIR, a checkout of the code before these limits, e.g. `git worktree add /tmp/base 17e7994`):
  the same decoded case on that code's service at its defaults.
Peak RSS growth is the service process's VmHWM (reset through /proc/<pid>/clear_refs before each case) less its
VmRSS before. Goal: refused with 413 both ways; decoded: /health under HEALTH_GOAL_MS while it decodes and peak RSS
growth under RSS_GOAL_MB.

Run: python bench/bench_image_limits.py [--baseline DIR] [--rounds 5] [--tiny] (printed, not saved)
"""
from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402
from tasks.core.env import PARAMS_ENV, TELEMETRY_OFF  # noqa: E402
from tasks.core.procs import free_port, http_ok, start_child, wait_until_ready  # noqa: E402

SIDE = 6300
COPIES = 100            # in one multipart body: ~3.9 MB, under serve.max_body_mb
HEALTH_GOAL_MS = 100.0  # /health while a decode runs (it took seconds when the decode held the event loop)
RSS_GOAL_MB = 200.0
NOTES = ("The real service (`python -m serving --model-file`, uvicorn on 127.0.0.1) on an untrained 32x32 RGB image "
         "model. refused: at this code's defaults, the PNG alone (JSON base64) and a hundred of it in one multipart "
         "body, the median time to the answer over the rounds. decoded: images.serve_pixels_factor raised so the PNG "
         "is decoded, /health polled back to back while it decodes. before: the same decoded case on the code before "
         "these limits (--baseline, its defaults). Peak RSS growth: the service's VmHWM (reset through clear_refs) "
         "less its VmRSS before the case. ratio: /health's worst latency during the decode, before over now.")


def service(code: Path, model: Path, folder: Path, images: dict):
    """A started service over `model`, running `code`'s serving package with `images` params overrides."""
    from ruamel.yaml import YAML

    yaml = YAML()
    params = yaml.load((code / "params.yaml").read_text())
    params["images"].update(images)
    params_file = folder / f"params-{len(list(folder.glob('params-*')))}.yaml"
    with params_file.open("w") as handle:
        yaml.dump(params, handle)
    port = free_port()
    env = {**os.environ, PARAMS_ENV: str(params_file), "PYTHONPATH": str(code), **TELEMETRY_OFF}
    child = start_child("service", [sys.executable, "-m", "serving", "--port", str(port), "--model-file", str(model),
                                    "--request-log", ""], folder / f"{params_file.stem}.log", env=env, cwd=code)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(child, http_ok(f"{url}/ready"), timeout=120)
    return child, url


def memory_kb(pid: int) -> dict[str, int]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> int:
    """The process's RSS now (KiB), its peak reset to it (clear_refs 5), so the next VmHWM is this case's peak."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return memory_kb(pid)["VmRSS"]


def refused(url: str, pid: int, png: bytes, rounds: int) -> dict:
    """The PNG alone and COPIES of it in one body: statuses, median ms to the answer, peak RSS growth."""
    before = reset_peak(pid)
    alone, many, statuses = [], [], set()
    body = {"images": [base64.b64encode(png).decode()]}
    files = [("image", (f"{i}.png", png, "image/png")) for i in range(COPIES)]
    for _ in range(rounds):
        started = time.perf_counter()
        statuses.add(requests.post(f"{url}/predict", json=body, timeout=600).status_code)
        alone.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        statuses.add(requests.post(f"{url}/predict", files=files, timeout=600).status_code)
        many.append((time.perf_counter() - started) * 1e3)
    return {"statuses": sorted(statuses), "alone_ms": round(statistics.median(alone), 1),
            "hundred_ms": round(statistics.median(many), 1),
            "rss_growth_mb": round((memory_kb(pid)["VmHWM"] - before) / 1024, 1)}


def decoded(url: str, pid: int, png: bytes) -> dict:
    """The PNG decoded while /health is polled: the decode's time, /health's latencies during it, peak RSS growth."""
    before = reset_peak(pid)
    latencies, done, answer = [], threading.Event(), {}

    def decode() -> None:
        started = time.perf_counter()
        answer["status"] = requests.post(f"{url}/predict", json={"images": [base64.b64encode(png).decode()]},
                                         timeout=600).status_code
        answer["ms"] = (time.perf_counter() - started) * 1e3
        done.set()

    worker = threading.Thread(target=decode)
    worker.start()
    with requests.Session() as session:
        while not done.is_set():
            started = time.perf_counter()
            session.get(f"{url}/health", timeout=600)
            latencies.append((time.perf_counter() - started) * 1e3)
    worker.join()
    return {"status": answer["status"], "decode_ms": round(answer["ms"], 1), "health_polls": len(latencies),
            "health_median_ms": round(statistics.median(latencies), 2), "health_max_ms": round(max(latencies), 2),
            "rss_growth_mb": round((memory_kb(pid)["VmHWM"] - before) / 1024, 1)}


def measure(code: Path, model: Path, folder: Path, png: bytes, images: dict, cases: list[str], rounds: int) -> dict:
    child, url = service(code, model, folder, images)
    try:
        found = {}
        if "refused" in cases:
            found["refused"] = refused(url, child.process.pid, png, rounds)
        if "decoded" in cases:
            found["decoded"] = decoded(url, child.process.pid, png)
        return found
    finally:
        child.stop()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout of the code before these limits")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="one round, printed, not saved")
    return parser.parse_args()


def main() -> None:
    from tasks.core.schema_spec import Schema
    from tasks.modalities.image.contract import ImageShape
    from tests.helpers.images import bomb_png, served_image_model

    args = parse_args()
    rounds = 1 if args.tiny else args.rounds
    schema = Schema(source="bench", target="label", classes=["a", "b", "c"], modality="image",
                    inputs=ImageShape(height=32, width=32, channels=3, mode="RGB").model_dump())
    with tempfile.TemporaryDirectory(prefix="bench-image-limits-") as tmp:
        folder = Path(tmp)
        model = served_image_model(folder, schema)
        png = bomb_png(folder / "black.png", SIDE, SIDE).read_bytes()
        figures = {"file_bytes": len(png), "pixels": SIDE * SIDE, "model": "32x32 RGB",
                   **measure(ROOT, model, folder, png, {}, ["refused"], rounds),
                   **measure(ROOT, model, folder, png, {"serve_pixels_factor": 1e6}, ["decoded"], rounds)}
        baseline = ({"before": measure(args.baseline.resolve(), model, folder, png, {}, ["decoded"], rounds)
                     ["decoded"]} if args.baseline else {})
    r, d = figures["refused"], figures["decoded"]
    met = (r["statuses"] == [413] and d["status"] == 200 and d["health_max_ms"] < HEALTH_GOAL_MS
           and d["rss_growth_mb"] < RSS_GOAL_MB)
    goal = (f"the {SIDE:,}x{SIDE:,} PNG refused unread (413) alone and {COPIES} in one body; decoded (its limit "
            f"raised): /health < {HEALTH_GOAL_MS:g} ms while it decodes, peak RSS growth < {RSS_GOAL_MB:g} MB")
    ratio = baseline["before"]["health_max_ms"] / d["health_max_ms"] if baseline else 0.0
    if args.tiny:
        print(figures, baseline, met)
        return
    save("image_limits", "An image model's service against a 6,300 x 6,300 all-black PNG: refused unread by default; "
         "decoded (limit raised) off the event loop", figures, baseline, ratio, goal, met,
         notes=NOTES)


if __name__ == "__main__":
    main()
