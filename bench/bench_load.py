"""The service under sustained load: memory and file descriptors before and after 60 s at 32 connections.

One project with a registered champion (a fresh `torchship run` in a throwaway copy of this working tree, or
`--project DIR`, a project whose pipeline already ran: its code is refreshed from this tree). Each server is
started alone on 127.0.0.1 and warmed (WARM_S of the same load, so one-time allocations - ONNX Runtime's arenas,
the first log buffers - are not counted as growth); then "before" is read, wrk loads it for SECONDS (closed loop,
2 threads, 32 keep-alive connections, one holdout row per request, as bench/bench_serving.py), the server is
left SETTLE_S to flush its request log, and "after" is read. Read: the resident memory of every process in the
server's tree, and the open file descriptors of the process holding the listening socket.

Servers: torchship's service as `torchship serve` runs it (serve defaults: champion, validation, metrics, request
log on, micro-batching), and the baseline, bench/minimal_onnx_app.py (FastAPI + ONNX Runtime on the same ONNX
bytes) under the same load: its RSS growth beside ours, as a ratio. Goal: torchship's RSS growth
<= 5%, open descriptors within +-2, zero 5xx (wrk counts every non-2xx/3xx answer: zero of those is zero 5xx).

Run: python bench/bench_load.py [--seconds 60] [--project DIR] [--tiny] (--tiny: the tests' tiny params for a
fresh project; the serving path is the same, the model smaller)
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

from bench.bench_serving import champion, prepare, project_env, refreshed, server_command, wrk  # noqa: E402
from bench.common import save  # noqa: E402

SERVERS = ("torchship", "minimal")
WARM_S, SETTLE_S = 5, 2
GOAL_GROWTH, GOAL_FDS = 0.05, 2


def listener(pid: int, port: int):
    """The process of `pid`'s tree that holds the socket listening on `port`."""
    import psutil

    parent = psutil.Process(pid)
    for proc in [parent, *parent.children(recursive=True)]:
        if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in proc.net_connections("tcp")):
            return proc
    raise RuntimeError(f"nothing in process {pid}'s tree listens on {port}")


def reading(pid: int, port: int) -> dict:
    """Resident MiB of the whole tree and of the listening process; its open descriptors."""
    import psutil

    parent = psutil.Process(pid)
    tree = [parent, *parent.children(recursive=True)]
    worker = listener(pid, port)
    return {"rss_mib": round(sum(p.memory_info().rss for p in tree) / 2**20, 1),
            "worker_rss_mib": round(worker.memory_info().rss / 2**20, 1), "fds": worker.num_fds()}


def load(server: str, root: Path, champ: tuple, seconds: float, folder: Path) -> dict:
    from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready

    name, version, onnx_path, row = champ
    port = free_port()
    command, _ = server_command(server, root, name, version, onnx_path, port)
    child = start_child(server, command, folder / f"{server}.log", env=project_env(root), cwd=root)
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"rows": [row]})
    with running([child]):
        wait_until_ready(child, http_ok(url + ("/docs" if server == "minimal" else "/ready")), timeout=180)
        cold = reading(child.process.pid, port)
        warm = wrk(url + "/predict", body, WARM_S, folder)
        before = reading(child.process.pid, port)
        figures = wrk(url + "/predict", body, seconds, folder)
        time.sleep(SETTLE_S)   # the request log's last flush, idle connections closed
        after = reading(child.process.pid, port)
    growth = after["rss_mib"] / before["rss_mib"] - 1
    out = {"requests": figures["requests"], "requests_per_s": round(figures["requests_per_s"]),
           "non2xx": figures["non2xx"] + warm["non2xx"], "socket_errors": figures["socket_errors"],
           "p99_ms": round(figures["p99_us"] / 1e3, 2), "cold": cold, "before": before, "after": after,
           "rss_growth_pct": round(100 * growth, 2),
           "worker_rss_growth_pct": round(100 * (after["worker_rss_mib"] / before["worker_rss_mib"] - 1), 2),
           "fd_delta": after["fds"] - before["fds"]}
    print(f"{server:9s}: {out['requests']:,} requests ({out['requests_per_s']:,}/s), non-2xx {out['non2xx']}, "
          f"RSS {before['rss_mib']} -> {after['rss_mib']} MiB ({out['rss_growth_pct']:+.2f}%), "
          f"fds {before['fds']} -> {after['fds']}", flush=True)
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--project", type=Path, help="a project whose pipeline already ran")
    parser.add_argument("--tiny", action="store_true", help="a fresh project on the tests' tiny params")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install -y wrk")
    base = None
    if args.project:
        root = refreshed(args.project)
    else:
        base = Path(tempfile.mkdtemp(prefix="bench-load-"))
        root = prepare("default", base / "default", args.tiny)
    champ, params = champion(root), described(root)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as folder:
        results = {server: load(server, root, champ, args.seconds, Path(folder)) for server in SERVERS}
    if base is not None:   # the project goes: what was read from it, was read above
        shutil.rmtree(base, ignore_errors=True)
    ours, floor = results["torchship"], results["minimal"]
    met = (ours["rss_growth_pct"] <= 100 * GOAL_GROWTH and abs(ours["fd_delta"]) <= GOAL_FDS
           and ours["non2xx"] == 0 and ours["socket_errors"] == 0)
    ratio = (1 + ours["rss_growth_pct"] / 100) / (1 + floor["rss_growth_pct"] / 100)
    figures = {"requests": ours["requests"], "rss_before_mib": ours["before"]["rss_mib"],
               "rss_after_mib": ours["after"]["rss_mib"], "rss_growth_pct": ours["rss_growth_pct"],
               "fds_before": ours["before"]["fds"], "fds_after": ours["after"]["fds"], "non2xx": ours["non2xx"],
               "load": results}
    baseline = {"minimal requests": floor["requests"], "minimal rss_growth_pct": floor["rss_growth_pct"],
                "minimal fd_delta": floor["fd_delta"], "minimal non2xx": floor["non2xx"]}
    save("load", f"The service under {args.seconds:g} s of load at 32 connections: RSS and descriptors before/after",
         figures, baseline, ratio, "RSS growth <= 5%, open descriptors within +-2, zero 5xx (ratio: torchship's "
         "RSS after/before over the minimal app's)", met,
         notes=NOTES.format(seconds=args.seconds, model=champ[0] + " v" + champ[1], params=params))


def described(root: Path) -> str:
    from tasks.config import load_params

    params = load_params(root / "params.yaml")
    return f"data.rows {params.data.rows}, train.model {params.train.model}, serve defaults"


NOTES = ("One project ({model}, {params}); each server alone on 127.0.0.1, warmed 5 s under the same load, then read "
         "(RSS of every process in its tree, descriptors of the listening process), loaded {seconds:g} s by wrk "
         "(2 threads, 32 keep-alive connections, one holdout row per POST), left 2 s, read again. torchship: "
         "`python -m serving` at the serve defaults, request log on; minimal: bench/minimal_onnx_app.py. Every "
         "answer counted by wrk: non-2xx covers 5xx.")


if __name__ == "__main__":
    main()
