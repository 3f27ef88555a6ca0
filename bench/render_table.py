"""Render README's performance table from bench/results/*.json (no hand-typed figures)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- perf:start -->", "<!-- perf:end -->"


def _figure(values: dict) -> str:
    shown = {k: v for k, v in values.items() if not isinstance(v, (list, dict))}
    return ", ".join(f"{k} {v:,}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in shown.items())


def _stat(stat: dict) -> str:
    """A mean over seeds, with its spread when there was more than one seed."""
    return f"{stat['mean']:.4f}" + (f" ± {stat['sd']:.4f}" if stat.get("sd") is not None else "")


def _seconds(stat: dict) -> str:
    return f"{stat['mean']:.0f}" + (f" ± {stat['sd']:.0f}" if stat.get("sd") is not None else "")


def _pair(figures: dict) -> str:
    return f"{_stat(figures['accuracy'])} / {_stat(figures['f1_macro'])}"


def _table_row(name: str, served: dict, baseline: dict) -> str:
    """One table of a per-table result: served vs both baselines, the gap, the goal and the wall time."""
    wall = _seconds(served["wall_s"])
    if not baseline:   # no seed finished: the errors are listed under the table
        return f"| {name} | — | — | — | failed | — | — | — | **no** | {wall} |"
    rows = served["rows"]
    features = served["features"]
    gap = served["gap_points"]
    met = "yes" if served["goal_met"] else "**no**"
    return (f"| {name} | {sum(rows.values()):,} ({rows['train']:,} train) | {features['numeric']} + "
            f"{features['categorical']} | {served['classes']} | {_pair(served['served'])} "
            f"({', '.join(served['served_variants'])}; bless passed {served['bless_passed']}/{served['finished']}) | "
            f"{_pair(baseline['logistic_regression'])} | {_pair(baseline['hist_gradient_boosting'])} | "
            f"{gap['accuracy']:+.2f} / {gap['f1_macro']:+.2f} | {met} | {wall} |")


def _one_line(text: str, limit: int = 400) -> str:
    """An error's tail as one Markdown-safe line."""
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else "…" + flat[-limit:]


def render_per_table(result: dict) -> list[str]:
    """A result with figures.per_table (bench/bench_tables.py) as its own table under the main one."""
    per_table, baselines = result["figures"]["per_table"], result["baseline"]["per_table"]
    lines = ["", f"**{result['title']}** ({result['measured_at'][:10]}, {result['machine']['cores']} cores; "
                 f"goal: {result['goal']}). Holdout accuracy / macro-F1, mean ± sd over seeds; gap = best baseline "
                 "minus served, in points (positive = served behind).", "",
             "| table | rows | features (num + cat) | classes | served: accuracy / macro-F1 | logistic regression | "
             "gradient boosting | gap to best (points) | met | pipeline wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_table_row(name, served, baselines.get(name, {})) for name, served in per_table.items()]
    lines += [f"- *{name}* seed {seed} failed: {_one_line(error)}" for name, served in per_table.items()
              for seed, error in served.get("errors", {}).items()]
    return lines


def render_serving(result: dict) -> list[str]:
    """A result with figures.serving_tables (bench/bench_serving.py): the three servers side by side per table."""
    lines = ["", f"**{result['title']}** ({result['measured_at'][:10]}, {result['machine']['cores']} cores; "
                 f"goal: {result['goal']}). Medians over rounds.", "",
             "| table | server | requests/s | p50 ms | p99 ms | RSS MiB: worker (all processes) | errors |",
             "|---|---|---|---|---|---|---|"]
    for table, servers in result["figures"]["serving_tables"].items():
        for server, f in servers.items():
            lines.append(f"| {table} | {server} | {f['requests_per_s']:,.0f} | {f['p50_us'] / 1e3:.2f} | "
                         f"{f['p99_us'] / 1e3:.2f} | {f['rss_mib']:.0f} ({f.get('tree_rss_mib', f['rss_mib']):.0f}) | "
                         f"{f['errors']} |")
    return lines


def render(results: list[dict]) -> str:
    lines = [START, "", "| benchmark | torchship | baseline (same run) | ratio | goal | met | measured |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r["name"]):
        met = {True: "yes", False: "**no**", None: "—"}[r.get("goal_met")]
        lines.append(f"| {r['title']} | {_figure(r['figures'])} | {_figure(r['baseline'])} | {r['ratio']}x | "
                     f"{r['goal']} | {met} | {r['measured_at'][:10]}, {r['machine']['cores']} cores |")
    for r in sorted(results, key=lambda r: r["name"]):
        if "per_table" in r["figures"]:
            lines += render_per_table(r)
        if "serving_tables" in r["figures"]:
            lines += render_serving(r)
    notes = [f"- *{r['title']}*: {r['notes']}" for r in sorted(results, key=lambda r: r["name"]) if r.get("notes")]
    lines += ["", "Rendered by `python bench/render_table.py` from `bench/results/*.json`; rerun all with `make bench`.",
              *notes, "", END]
    return "\n".join(lines)


def main() -> None:
    results = [json.loads(p.read_text()) for p in sorted((ROOT / "bench" / "results").glob("*.json"))]
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text:
        sys.exit(f"README.md lacks the {START} ... {END} markers")
    text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: render(results), text, flags=re.S)
    readme.write_text(text)
    print(f"rendered {len(results)} benchmark(s) into README.md")


if __name__ == "__main__":
    main()
