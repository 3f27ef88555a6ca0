"""The dashboard's panels evaluated for real: a Prometheus (Debian's `prometheus` package) scrapes a running
`torchship` service every second during a load run, then every panel's PromQL (serving/observability.py, as
docs/observability/dashboard.json holds it) is asked of Prometheus's HTTP API (query_range) and plotted into
docs/observability/panels.png. The alert rules (docs/observability/alerts.yml) are loaded too: their state at
the end is printed.

The run, on one tiny `torchship run`'s champion (or --project DIR, a project whose pipeline already ran):
champion alone under wrk (2 threads, 32 connections, one of 200 holdout rows per request) for --phase-seconds;
then the same version also as `challenger` at a 30 % share; then bad requests (422) and a monitor verdict on disk
beside it.
Grafana's `$__rate_interval` becomes RATE_WINDOW (4 scrapes at 1 s).

Run: python bench/bench_dashboard.py [--project DIR] [--phase-seconds 15]
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_serving import CONNECTIONS, THREADS, champion, prepare, project_env, refreshed  # noqa: E402
from tasks.core.env import TOKEN_ENV  # noqa: E402

OUT = ROOT / "docs" / "observability" / "panels.png"
RATE_WINDOW = "4s"
TOKEN = "bench-dashboard"
PROMETHEUS_CONFIG = """global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [{rules}]
scrape_configs:
  - job_name: torchship
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
"""


ROWS_SCRIPT = r'''
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
bodies = {%s}
i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
'''


def load(url: str, bodies: list[str], seconds: float, folder: Path) -> None:
    """wrk (THREADS threads, CONNECTIONS connections) cycling through `bodies`, one per request."""
    import subprocess

    script = folder / "rows.lua"
    script.write_text(ROWS_SCRIPT % ", ".join(f"[==[{b}]==]" for b in bodies))
    subprocess.run(["wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", "--timeout", "5s",
                    "-s", str(script), url], capture_output=True, check=True, timeout=seconds + 60)


def query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict]:
    import httpx

    answer = httpx.get(f"{prometheus}/api/v1/query_range",
                       params={"query": expr, "start": start, "end": end, "step": "1s"}, timeout=30).json()
    if answer["status"] != "success":
        raise RuntimeError(f"Prometheus refused {expr}: {answer}")
    return answer["data"]["result"]


def legend(template: str, labels: dict) -> str:
    for key, value in labels.items():
        template = template.replace("{{" + key + "}}", value)
    return template


def plot(panels: list, results: list[list[tuple[str, list]]], start: float, end: float,
         phases: list[tuple[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / 2)
    figure, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    for ax, panel, series in zip(axes.flat, panels, results):
        for name, points in series:
            ax.plot([t - start for t, _ in points], [v for _, v in points], label=name, linewidth=1.2)
        if panel.threshold is not None:
            ax.axhline(panel.threshold, color="red", linestyle="--", linewidth=1, label="objective")
        for _label, at in phases:
            ax.axvline(at - start, color="grey", linewidth=0.6)
        ax.set_xlim(-3, end - start)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("seconds since the load started", fontsize=8)
        ax.set_ylabel(panel.unit, fontsize=8)
        if panel.unit == "s":
            ax.set_yscale("log")
        ax.legend(fontsize=7, loc="best")
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    figure.suptitle("torchship dashboard panels, queried from a real Prometheus (1 s scrapes) during a wrk load; "
                    "grey lines: challenger at 30 %, then 1 bad request in 21 + a drift verdict", fontsize=10)
    figure.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(OUT, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path)
    parser.add_argument("--phase-seconds", type=float, default=15)
    args = parser.parse_args()
    import httpx
    from mlflow import MlflowClient

    from serving.observability import RATE, RULES_FILE, observability_files, panels
    from tasks.config import load_params
    from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready

    if shutil.which("prometheus") is None:
        sys.exit("prometheus is not installed: apt-get install prometheus (Debian's package), or make bench")
    work = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    root = refreshed(args.project.resolve()) if args.project else prepare("default", work / "project", tiny=True)
    params = load_params(ROOT / "params.yaml")   # the objectives docs/observability/ holds
    name, version, _, row = champion(root)
    import pandas as pd

    from tasks.core.schema_spec import load_schema

    features = load_schema(root / "data/prepare/schema.json").feature_names
    holdout = pd.read_parquet(root / "data/prepare/holdout.parquet")[features].head(200)
    bodies = [json.dumps({"rows": [{k: (None if pd.isna(v) else v) for k, v in r.items()}]})
              for r in holdout.to_dict("records")]
    (work / RULES_FILE).write_text(observability_files(params.slo, params.monitor)[RULES_FILE])
    port, prom_port = free_port(), free_port()
    (work / "prometheus.yml").write_text(PROMETHEUS_CONFIG.format(rules=json.dumps(str(work / RULES_FILE)),
                                                                  port=port))
    env = {**project_env(root), TOKEN_ENV: TOKEN}
    service = start_child("torchship", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", name],
                          work / "service.log", env=env, cwd=root)
    prometheus = start_child("prometheus", ["prometheus", f"--config.file={work / 'prometheus.yml'}",
                                            f"--storage.tsdb.path={work / 'tsdb'}",
                                            f"--web.listen-address=127.0.0.1:{prom_port}"],
                             work / "prometheus.log", cwd=work)
    url, prom = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{prom_port}"
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with running([service, prometheus]):
        wait_until_ready(service, http_ok(url + "/ready"), timeout=120)
        wait_until_ready(prometheus, http_ok(prom + "/-/ready"), timeout=60)
        time.sleep(3)   # a few scrapes before the load: rates start from a known zero
        start = time.time()
        load(url + "/predict", bodies, args.phase_seconds, work)
        client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
        client.set_registered_model_alias(name, "challenger", version)   # the same bytes as a challenger
        httpx.post(url + "/admin/reload", headers=admin, timeout=60).raise_for_status()
        httpx.post(url + "/admin/share", params={"share": 0.3}, headers=admin, timeout=10).raise_for_status()
        phases = [("challenger at 30 %", time.time())]
        load(url + "/predict", bodies, args.phase_seconds, work)
        phases.append(("bad requests + drift verdict", time.time()))
        monitor = root / "data" / "monitor"
        monitor.mkdir(parents=True, exist_ok=True)
        (monitor / "latest.json").write_text(json.dumps({"gate": {"status": "fail"},
                                                         "findings": {"drifted_share": 0.5}}))
        numeric = next(key for key, value in row.items() if isinstance(value, float))
        bad = json.dumps({"rows": [{**row, numeric: "not a number"}]})
        load(url + "/predict", [*bodies[:20], bad], args.phase_seconds / 2, work)   # 1 request in 21 refused
        load(url + "/predict", bodies, args.phase_seconds / 2, work)
        time.sleep(3)   # the last scrapes
        end = time.time()
        client.delete_registered_model_alias(name, "challenger")
        (monitor / "latest.json").unlink()
        shown = panels(params.slo, params.monitor)
        results = [[(legend(label, s["metric"]), [(float(t), float(v)) for t, v in s["values"]])
                    for expr, label in panel.queries for s in query_range(prom, expr.replace(RATE, RATE_WINDOW),
                                                                          start - 3, end)]
                   for panel in shown]
        alerts = httpx.get(prom + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    plot(shown, results, start, end, phases)
    for panel, series in zip(shown, results):
        print(f"{panel.title}: {len(series)} series, {sum(len(p) for _, p in series)} points")
    print("alerts at the end:", [(a["labels"]["alertname"], a["state"]) for a in alerts] or "none")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
