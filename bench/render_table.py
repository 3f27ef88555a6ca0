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


def render(results: list[dict]) -> str:
    lines = [START, "", "| benchmark | torchship | baseline (same run) | ratio | goal | met | measured |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r["name"]):
        met = {True: "yes", False: "**no**", None: "—"}[r.get("goal_met")]
        lines.append(f"| {r['title']} | {_figure(r['figures'])} | {_figure(r['baseline'])} | {r['ratio']}x | "
                     f"{r['goal']} | {met} | {r['measured_at'][:10]}, {r['machine']['cores']} cores |")
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
