"""Serving at the HTTP floor: torchship's service vs `mlflow models serve` vs a minimal FastAPI + ONNX Runtime app
(bench/minimal_onnx_app.py), all three on the same registered version, machine and load generator in one run.

Per table (the default synthetic data, 11 columns; scikit-learn digits, 64 numeric columns): one real
`torchship run` at params.yaml's defaults in a throwaway copy of this working tree (tests.conftest.make_project),
then ROUNDS rounds, round-robin over the servers; in each, every server is started alone on 127.0.0.1, warmed
(WARM_S of load), measured (SECONDS of load) and stopped. Load: wrk (closed loop, 2 threads, 32 connections,
keep-alive), POSTing one holdout row as the server's own JSON shape ({"rows": [row]}, or {"dataframe_records":
[row]} for MLflow) - the generator shares the 2 cores with the server. torchship serves as `torchship serve`
would: champion only, contract validation, metrics, and the request log on (every row written). Figures: the
median over rounds of requests/s and of p50/p99 (wrk's, from its full histogram), errors (non-2xx + socket),
and the serving process's resident memory after the load (for MLflow: its uvicorn process, not the CLI parent).
torchship-2w is the same service with serve.workers 2 (measured for the stretch; the goals are judged on the
default, one worker). Goal: torchship >= 1.0x the minimal app's requests/s, p99 no worse than either peer, RSS
<= mlflow's; the stretch >= 5x mlflow's requests/s.

Run: python bench/bench_serving.py [--tables default,digits] [--rounds 3] [--seconds 10] [--keep DIR]
     [--project NAME=DIR ...] (a project a previous --keep left, its pipeline already run; its code is
     refreshed from this working tree) [--tiny] (dry run:
     tests' tiny params, 1 round, printed, not saved)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import save  # noqa: E402
from tasks.core.env import MLFLOW_TRACKING_URI_ENV, TELEMETRY_OFF  # noqa: E402
from tasks.modalities.image.contract import image_shape  # noqa: E402

BIN = Path(sys.executable).parent
TABLES = {"default": ("synthetic", []), "digits": ("sklearn:digits", ["data.source=sklearn:digits"]),
          # images (the digits as 8x8 PNG files): one image per request; `--tables images --save-as image_serving`
          "images": ("images:digits", ["data.source=images:digits"])}
SERVERS = ("torchship", "mlflow", "minimal", "torchship-2w")
IMAGE = "png"   # the key of an image champion's request in champion()   # the last: serve.workers 2, for the stretch
THREADS, CONNECTIONS, WARM_S = 2, 32, 3
WRK_SCRIPT = r'''
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK {"requests": %%d, "duration_us": %%d, "non2xx": %%d, "socket_errors": %%d, ' ..
    '"p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\n', summary.requests, summary.duration,
    e.status, e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
'''


def project_env(root: Path) -> dict[str, str]:
    """The user's shell in the project: the venv first, the copy's own code first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTEST_"))}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(root),
            **TELEMETRY_OFF, MLFLOW_TRACKING_URI_ENV: f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"}


def prepare(table: str, folder: Path, tiny: bool) -> Path:
    """A project copy with `table`'s pipeline run (a registered champion)."""
    from tests.conftest import make_project

    project = make_project(folder, tiny=tiny)
    sets = [arg for s in TABLES[table][1] for arg in ("--set", s)]
    started = time.perf_counter()
    result = subprocess.run([str(BIN / "torchship"), "run", *sets], cwd=folder, env=project_env(folder),
                            capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"{table}: torchship run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    print(f"{table}: pipeline ran in {time.perf_counter() - started:.0f} s", flush=True)
    return project.root


def refreshed(root: Path) -> Path:
    """A project prepared before, with this working tree's code and `serve` params (the service runs the project's
    own copy; nothing the pipeline made depends on them)."""
    from ruamel.yaml import YAML

    for package in ("serving", "tasks", "models"):
        shutil.copytree(ROOT / package, root / package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    yaml = YAML()
    params = yaml.load((root / "params.yaml").read_text())
    params["serve"] = yaml.load((ROOT / "params.yaml").read_text())["serve"]
    with (root / "params.yaml").open("w") as handle:
        yaml.dump(params, handle)
    return root


def champion(root: Path) -> tuple[str, str, Path, dict]:
    """(model name, champion version, its ONNX file, one holdout row as a client sends it: for an image model
    {"png": base64 of one holdout image as a PNG file, "pixels": its uint8 pixels as nested lists})."""
    import pandas as pd
    from mlflow import MlflowClient

    from tasks.core.schema_spec import load_schema
    from tasks.registry.read import download_onnx

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    name = client.search_registered_models()[0].name
    version = str(client.get_model_version_by_alias(name, "champion").version)
    onnx_path = download_onnx(client, name, version, Path(tempfile.mkdtemp(prefix="bench-serving-")))
    schema = load_schema(root / "data/prepare/schema.json")
    if schema.modality == "image":
        import base64

        from tasks.modalities.image.decode import encode_png
        from tasks.modalities.image.shards import read_pixels

        image = read_pixels(root / "data/prepare/holdout.parquet", image_shape(schema).shape)[0]
        return name, version, onnx_path, {IMAGE: base64.b64encode(encode_png(image)).decode(),
                                          "pixels": image.tolist()}
    frame = pd.read_parquet(root / "data/prepare/holdout.parquet")[schema.feature_names].head(1)
    row = {k: (None if pd.isna(v) else v) for k, v in frame.iloc[0].to_dict().items()}
    return name, version, onnx_path, row


def server_command(server: str, root: Path, name: str, version: str, onnx_path: Path, port: int) -> tuple[list, dict]:
    if server.startswith("torchship"):
        workers = ["--workers", "2"] if server == "torchship-2w" else []
        return [sys.executable, "-m", "serving", "--port", str(port), "--model-name", name, *workers], {}
    if server == "mlflow":
        return [str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{name}/{version}", "--env-manager", "local",
                "--host", "127.0.0.1", "--port", str(port)], {}
    return [sys.executable, str(ROOT / "bench" / "minimal_onnx_app.py"), str(onnx_path), str(port)], {}


def payload(server: str, row: dict) -> str:
    """One request's body in each server's own shape (an image: a base64 PNG file, or MLflow's tensor input)."""
    if IMAGE in row:
        return json.dumps({"inputs": [row["pixels"]]} if server == "mlflow" else {"images": [row[IMAGE]]})
    return json.dumps({"dataframe_records": [row]} if server == "mlflow" else {"rows": [row]})


def worker_rss(pid: int, port: int) -> float:
    """MiB resident of the largest process in `pid`'s tree that holds the socket listening on `port` (a worker;
    for MLflow its uvicorn process, not the CLI parent; for several workers, the largest)."""
    import psutil

    parent = psutil.Process(pid)
    sizes = [proc.memory_info().rss for proc in [parent, *parent.children(recursive=True)]
             if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in proc.net_connections("tcp"))]
    if not sizes:
        raise RuntimeError(f"nothing in process {pid}'s tree listens on {port}")
    return max(sizes) / 2**20


def tree_rss(pid: int) -> float:
    """MiB resident of every process in `pid`'s tree (MLflow's CLI parent, torchship's registry watcher)."""
    import psutil

    parent = psutil.Process(pid)
    return sum(proc.memory_info().rss for proc in [parent, *parent.children(recursive=True)]) / 2**20


def wrk(url: str, body: str, seconds: float, folder: Path) -> dict:
    script = folder / "post.lua"
    script.write_text(WRK_SCRIPT % body)
    result = subprocess.run(["wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s",
                             "--timeout", "5s", "-s", str(script), url],
                            capture_output=True, text=True, timeout=seconds + 60)
    line = next((x for x in result.stdout.splitlines() if x.startswith("WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{result.stdout}\n{result.stderr}")
    figures = json.loads(line[4:])
    figures["requests_per_s"] = figures["requests"] / (figures["duration_us"] / 1e6)
    return figures


def measure(server: str, root: Path, champ: tuple, seconds: float, folder: Path) -> dict:
    """Start `server` alone, warm it, load it, read its RSS, stop it."""
    from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready

    name, version, onnx_path, row = champ
    port = free_port()
    command, _ = server_command(server, root, name, version, onnx_path, port)
    child = start_child(server, command, folder / f"{server}.log", env=project_env(root), cwd=root)
    probe = {"mlflow": "/ping", "minimal": "/docs"}.get(server, "/ready")
    url = f"http://127.0.0.1:{port}"
    with running([child]):
        wait_until_ready(child, http_ok(url + probe), timeout=120)
        path = "/invocations" if server == "mlflow" else "/predict"
        body = payload(server, row)
        wrk(url + path, body, WARM_S, folder)
        figures = wrk(url + path, body, seconds, folder)
        figures["rss_mib"] = worker_rss(child.process.pid, port)
        figures["tree_rss_mib"] = tree_rss(child.process.pid)
    return figures


def summarize(rounds: list[dict]) -> dict:
    """Median over rounds of each figure; errors summed."""
    keys = ("requests_per_s", "p50_us", "p99_us", "rss_mib", "tree_rss_mib")
    out = {k: round(statistics.median(r[k] for r in rounds), 1) for k in keys}
    out["errors"] = sum(r["non2xx"] + r["socket_errors"] for r in rounds)
    out["requests"] = sum(r["requests"] for r in rounds)
    return out


def run_table(table: str, root: Path, rounds: int, seconds: float) -> dict:
    champ = champion(root)
    print(f"{table}: {champ[0]} v{champ[1]}, payload {len(payload('torchship', champ[3]))} bytes", flush=True)
    results = {server: [] for server in SERVERS}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as folder:
        for i in range(rounds):
            for server in SERVERS:
                figures = measure(server, root, champ, seconds, Path(folder))
                results[server].append(figures)
                print(f"{table} round {i + 1}/{rounds} {server:9s}: {figures['requests_per_s']:8.0f} req/s  p50 "
                      f"{figures['p50_us'] / 1e3:6.2f} ms  p99 {figures['p99_us'] / 1e3:6.2f} ms  rss "
                      f"{figures['rss_mib']:.0f} MiB (all {figures['tree_rss_mib']:.0f})  errors "
                      f"{figures['non2xx'] + figures['socket_errors']}", flush=True)
    return {"model": f"{champ[0]} v{champ[1]}", "columns": 0 if IMAGE in champ[3] else len(champ[3]),
            "payload_bytes": len(payload("torchship", champ[3])),
            **{server: summarize(results[server]) for server in SERVERS}, "rounds": results}


def judge(tables: dict) -> tuple[float, bool, dict]:
    """ratio = the worst table's torchship / minimal requests/s; each goal per table (torchship = the default,
    one worker; torchship-2w only for the stretch)."""
    goals = {}
    for table, t in tables.items():
        ours, floor, mlflow = t["torchship"], t["minimal"], t["mlflow"]
        goals[table] = {"vs_minimal_rps": round(ours["requests_per_s"] / floor["requests_per_s"], 2),
                        "vs_mlflow_rps": round(ours["requests_per_s"] / mlflow["requests_per_s"], 2),
                        "vs_mlflow_rps_2_workers": round(t["torchship-2w"]["requests_per_s"]
                                                         / mlflow["requests_per_s"], 2),
                        "p99_no_worse": ours["p99_us"] <= min(floor["p99_us"], mlflow["p99_us"]),
                        "rss_no_more_than_mlflow": ours["rss_mib"] <= mlflow["rss_mib"],
                        "no_errors": ours["errors"] == 0 and t["torchship-2w"]["errors"] == 0}
        goals[table]["stretch_5x_mlflow"] = goals[table]["vs_mlflow_rps"] >= 5
    ratio = min(g["vs_minimal_rps"] for g in goals.values())
    met = all(g["vs_minimal_rps"] >= 1.0 and g["p99_no_worse"] and g["rss_no_more_than_mlflow"] and g["no_errors"]
              for g in goals.values())
    return ratio, met, goals


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="default,digits")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keep", type=Path, help="prepare the projects under this folder and keep them")
    parser.add_argument("--project", action="append", default=[], help="NAME=DIR: a project prepared before")
    parser.add_argument("--tiny", action="store_true", help="dry run on the tests' tiny params; not saved")
    parser.add_argument("--save-as", default="serving", help="the result's name (bench/results/NAME.json)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install -y wrk")
    given = dict(item.split("=", 1) for item in args.project)
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-serving-projects-"))
    tables = {}
    for table in args.tables.split(","):
        root = refreshed(Path(given[table])) if table in given else prepare(table, base / table, args.tiny)
        tables[table] = run_table(table, root, 1 if args.tiny else args.rounds, args.seconds)
    if args.keep is None and not given:
        shutil.rmtree(base, ignore_errors=True)
    ratio, met, goals = judge(tables)
    figures = {f"{table} {server} {k}": t[server][k] for table, t in tables.items() for server in SERVERS
               for k in ("requests_per_s", "p50_us", "p99_us", "rss_mib", "errors")}
    print(json.dumps({"goals": goals, "ratio": ratio, "met": met}, indent=2))
    if args.tiny:
        return
    save(args.save_as, "Serving at the HTTP floor: torchship's service vs mlflow models serve vs a minimal FastAPI + "
         "ONNX Runtime app (same registered version, wrk, 32 connections)",
         {**{k: v for k, v in figures.items() if k.split()[1] == "torchship"}, "goals": goals,
          "serving_tables": {t: {server: d[server] for server in SERVERS} for t, d in tables.items()},
          "tables": {t: {k: v for k, v in d.items() if k not in ("rounds", *SERVERS)} for t, d in tables.items()},
          "rounds": {t: d["rounds"] for t, d in tables.items()}},
         {k: v for k, v in figures.items() if k.split()[1] != "torchship"}, ratio,
         ">= 1.0x the minimal app's requests/s, p99 no worse than either peer, RSS <= mlflow models serve's, no "
         "errors (stretch: >= 5x mlflow's requests/s)", met, notes=NOTES.format(rounds=args.rounds,
                                                                                 seconds=args.seconds))


NOTES = ("Each table: one default `torchship run` in a fresh project copy, then {rounds} rounds round-robin over the "
         "servers, each started alone on 127.0.0.1, warmed 3 s, measured {seconds:g} s, stopped. Load: wrk 4.1 "
         "(closed loop, 2 threads, 32 keep-alive connections) POSTing one holdout row, sharing the 2 cores with the "
         "server. torchship: `python -m serving` at the serve defaults (champion only, contract validation, metrics, "
         "request log on, micro-batching on); torchship-2w: the same with serve.workers 2. RSS: the largest process "
         "holding the listening socket. mlflow: `mlflow models serve --env-manager local` (its uvicorn worker's RSS). "
         "minimal: bench/minimal_onnx_app.py (FastAPI, async route, pydantic body, uvicorn with uvloop+httptools, "
         "ORT 1 thread). Medians over rounds; p50/p99 from wrk's histogram.")


if __name__ == "__main__":
    main()
