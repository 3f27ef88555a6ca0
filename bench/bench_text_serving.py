"""Serving texts at the HTTP floor: torchship's service vs `mlflow models serve` vs a minimal FastAPI + ONNX Runtime
app (bench/minimal_onnx_app.py's text route), all three on the same registered text version (raw strings in, the
tokenizer inside the graph), machine and load generator in one run.

The project: one `torchship run` at params.yaml's defaults on `text:tickets` in a throwaway copy of this working tree
(or `--project DIR`, one bench/bench_text.py --keep left, its code refreshed from this tree). Then, as
bench/bench_serving.py does for tables and images (its wrk script, servers, RSS readings, medians and judgement are
reused here): ROUNDS rounds round-robin over the servers, each started alone on 127.0.0.1, warmed, measured and
stopped. Load: wrk (closed loop, 2 threads, 32 keep-alive connections) POSTing `--texts` holdout texts (the
median-length ones) per request in each server's own shape: `{"texts": [...]}` for torchship and the minimal app,
`{"inputs": [...]}` for MLflow. texts/s = requests/s x texts per request. torchship serves as `torchship serve`
would: champion only, text limits checked, metrics, and the request log on (descriptors and the embedding projection
of every text, no raw text). Goal (bench_serving's): torchship >= 1.0x the minimal app's requests/s, p99 no worse
than either peer, RSS <= mlflow's, no errors.

Run: python bench/bench_text_serving.py [--project DIR] [--rounds 3] [--seconds 10] [--texts 1] [--tiny]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_serving  # noqa: E402
from bench.common import save  # noqa: E402

TABLE = "tickets"   # the tweets end with no champion at the defaults (docs/text.md): nothing to serve
SERVERS = bench_serving.SERVERS


def champion(root: Path, count: int) -> tuple[str, str, Path, list[str]]:
    """(model name, champion version, its ONNX file, `count` holdout texts of median length)."""
    from mlflow import MlflowClient

    from tasks.modalities.text.shards import read_texts
    from tasks.registry.read import download_onnx

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    name = client.search_registered_models()[0].name
    try:
        version = str(client.get_model_version_by_alias(name, "champion").version)
    except Exception:   # MlflowException: bless refused every version
        raise SystemExit(f"{root}: {name} has no champion (bless refused it): serve a project that has one") from None
    onnx_path = download_onnx(client, name, version, Path(tempfile.mkdtemp(prefix="bench-text-serving-")))
    texts = sorted(read_texts(root / "data/prepare/holdout.parquet"), key=len)
    middle = len(texts) // 2
    return name, version, onnx_path, texts[middle:middle + count]


def payload(server: str, texts: list[str]) -> str:
    """One request's body in each server's own shape."""
    return json.dumps({"inputs": texts} if server == "mlflow" else {"texts": texts})


def measure(server: str, root: Path, champ: tuple, seconds: float, folder: Path) -> dict:
    """Start `server` alone, warm it, load it, read its RSS, stop it."""
    from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready

    name, version, onnx_path, texts = champ
    port = free_port()
    command, _ = bench_serving.server_command(server, root, name, version, onnx_path, port)
    child = start_child(server, command, folder / f"{server}.log", env=bench_serving.project_env(root), cwd=root)
    url = f"http://127.0.0.1:{port}"
    with running([child]):
        wait_until_ready(child, http_ok(url + {"mlflow": "/ping", "minimal": "/docs"}.get(server, "/ready")),
                         timeout=120)
        target, body = url + ("/invocations" if server == "mlflow" else "/predict"), payload(server, texts)
        bench_serving.wrk(target, body, bench_serving.WARM_S, folder)
        figures = bench_serving.wrk(target, body, seconds, folder)
        figures["rss_mib"] = bench_serving.worker_rss(child.process.pid, port)
        figures["tree_rss_mib"] = bench_serving.tree_rss(child.process.pid)
    return figures


def answers_agree(root: Path, champ: tuple, folder: Path) -> dict:
    """Each server's probabilities for the request's texts against ONNX Runtime's on the registered file: the
    largest difference (the load measures speed; this says the three answered the same thing)."""
    import httpx
    import numpy as np

    from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready
    from tasks.core.runtime import open_onnx
    from tasks.modalities.text.graph import text_feed

    name, version, onnx_path, texts = champ
    classes = json.loads((root / "data/prepare/schema.json").read_text())["classes"]
    expected = open_onnx(onnx_path, 1).run(["probabilities"], text_feed(texts))[0]
    worst = {}
    for server in ("torchship", "mlflow", "minimal"):
        port = free_port()
        command, _ = bench_serving.server_command(server, root, name, version, onnx_path, port)
        child = start_child(server, command, folder / f"{server}-agree.log", env=bench_serving.project_env(root),
                            cwd=root)
        url = f"http://127.0.0.1:{port}"
        with running([child]):
            wait_until_ready(child, http_ok(url + {"mlflow": "/ping", "minimal": "/docs"}.get(server, "/ready")),
                             timeout=120)
            answer = httpx.post(url + ("/invocations" if server == "mlflow" else "/predict"),
                                content=payload(server, texts), headers={"content-type": "application/json"},
                                timeout=30).json()
        got = probabilities_of(server, answer, classes)
        worst[server] = float(np.abs(np.asarray(got, dtype=np.float64) - expected).max())
    return worst


def probabilities_of(server: str, answer: dict, classes: list[str]) -> list:
    """The (N, C) probabilities in each server's own answer (torchship's name each class)."""
    if server == "mlflow":
        return answer["predictions"]["probabilities"]
    if server == "minimal":
        return answer["probabilities"]
    return [[row["probabilities"][c] for c in classes] for row in answer["predictions"]]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, help="a text project bench/bench_text.py --keep left (its champion "
                                                     "is served)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--texts", type=int, default=1, help="texts per request")
    parser.add_argument("--tiny", action="store_true", help="plumbing check: tiny params, 1 round; not saved")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install -y wrk")
    started = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="bench-text-serving-"))
    if args.project:
        root = bench_serving.refreshed(args.project)
    else:
        from bench.bench_text import run_pipeline

        root, _ = run_pipeline(base / TABLE, f"text:{TABLE}", args.tiny)
    champ = champion(root, args.texts)
    rounds = 1 if args.tiny else args.rounds
    results = {server: [] for server in SERVERS}
    agreement = answers_agree(root, champ, base)
    print(f"{champ[0]} v{champ[1]}: largest probability difference from ONNX Runtime {agreement}", flush=True)
    for i in range(rounds):
        for server in SERVERS:
            figures = measure(server, root, champ, args.seconds, base)
            results[server].append(figures)
            print(f"round {i + 1}/{rounds} {server:12s}: {figures['requests_per_s'] * args.texts:8.0f} texts/s  p50 "
                  f"{figures['p50_us'] / 1e3:6.2f} ms  p99 {figures['p99_us'] / 1e3:6.2f} ms  rss "
                  f"{figures['rss_mib']:.0f} MiB  errors {figures['non2xx'] + figures['socket_errors']}", flush=True)
    table = champ[0]   # the registered model's name: text-tweets or text-tickets
    servers = {server: bench_serving.summarize(runs) for server, runs in results.items()}
    for summary in servers.values():
        summary["texts_per_s"] = round(summary["requests_per_s"] * args.texts, 1)
    ratio, met, goals = bench_serving.judge({table: servers})
    figures = {"model": f"{champ[0]} v{champ[1]}", "texts_per_request": args.texts,
               "text_chars": [len(t) for t in champ[3]], "payload_bytes": len(payload("torchship", champ[3])),
               "max_probability_difference": agreement, "servers": servers, "goals": goals[table],
               "rounds": results, "bench_wall_s": round(time.perf_counter() - started)}
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({k: v for k, v in figures.items() if k != "rounds"}, indent=2))
    if args.tiny:
        return
    save("text_serving", "Serving texts at the HTTP floor: torchship's service vs mlflow models serve vs a minimal "
         "FastAPI + ONNX Runtime app (same registered text version, raw strings, wrk, 32 connections)", figures,
         {server: servers[server] for server in SERVERS if server != "torchship"}, ratio,
         ">= 1.0x the minimal app's texts/s, p99 no worse than either peer, RSS <= mlflow models serve's, no errors",
         met, notes=f"One default `torchship run` on text:{table.removeprefix('text-')} in a fresh project copy, then "
                    f"{rounds} rounds round-robin over the servers, each started alone on 127.0.0.1, warmed "
                    f"{bench_serving.WARM_S} s, measured {args.seconds:g} s, stopped; {args.texts} median-length "
                    "holdout text(s) per request. "
                    "wrk (closed loop, 2 threads, 32 keep-alive connections) shares the 2 cores with the server. "
                    "torchship: `python -m serving` at the serve defaults (request log on); torchship-2w: the same "
                    "with serve.workers 2; mlflow: `mlflow models serve --env-manager local`; minimal: "
                    "bench/minimal_onnx_app.py (FastAPI, pydantic body, ORT 1 thread). Medians over rounds; p50/p99 "
                    "from wrk's histogram. Before the load, each server's answer to the same texts is compared with "
                    "ONNX Runtime's on the registered file (max_probability_difference).")


if __name__ == "__main__":
    main()
