"""Render every benchmark figure in README.md and docs/*.md from bench/results/*.json (none is hand-typed).

A figure lives between markers `<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->`, where NAME is one of
RENDERERS below; a block may appear in several files and renders the same everywhere. A result file that does not
exist yet renders as "not measured yet". `python bench/render_table.py` rewrites the blocks in place;
`--check` rewrites nothing and exits 1 naming each stale block (tests/unit/test_docs.py does the same).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(r"(?P<start><!-- bench:(?P<name>[\w-]+):start -->)\n"
                   r"(?P<body>.*?)(?P<end><!-- bench:(?P=name):end -->)", re.S)
MARKER = re.compile(r"<!-- bench:([\w-]+):(start|end) -->")


class NotMeasured(Exception):
    """A block needs a result file that bench/results/ does not hold yet."""


def load_results(folder: Path = RESULTS) -> dict[str, dict]:
    """Every result file, by its name (bench/results/<name>.json)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def doc_files(root: Path = ROOT) -> list[Path]:
    """The files whose figures are rendered: the README and the guides."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _need(results: dict[str, dict], name: str) -> dict:
    if name not in results:
        raise NotMeasured(name)
    return results[name]


def _when(result: dict) -> str:
    return f"{result['measured_at'][:10]}, {result['machine']['cores']} cores"


def _figure(values: dict) -> str:
    shown = {k: v for k, v in values.items()     # nested figures and recorded console text have their own blocks
             if not isinstance(v, (list, dict)) and not (isinstance(v, str) and "\n" in v)}
    return ", ".join(f"{k} {v:,}" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"{k} {v}"
                     for k, v in shown.items())


def _ci(stat: dict, scale: float = 1.0, digits: int = 4, sign: str = "") -> str:
    """A mean over seeds with its 95% interval half-width, when there was more than one seed."""
    text = f"{stat['mean'] * scale:{sign}.{digits}f}"
    return text + (f" ± {stat['ci95'] * scale:.{digits}f}" if stat.get("ci95") is not None else "")


def _table_row(name: str, table: dict) -> str:
    """One table: the served model vs the cross-validation-picked baseline (macro-F1 / accuracy), the paired gap,
    bless per seed, the goal and the train seconds."""
    rows, runs = table["rows"], len(table["runs"])
    served, baseline, gap = table["served"], table["baseline"], table["gap_points"]
    picked = ", ".join(name.replace("_", " ").replace("hist gradient boosting", "boosting")
                       for name in table["baseline_picked"])
    return (f"| {name} | {sum(rows.values()):,} ({rows['train']:,} train) | {table['classes']} | {runs} | "
            f"{_ci(served['f1_macro'])} / {_ci(served['accuracy'])} ({', '.join(table['families'])}) | "
            f"{_ci(baseline['f1_macro'])} / {_ci(baseline['accuracy'])} ({picked}) | "
            f"{_ci(gap['f1_macro'], digits=2, sign='+')} / {_ci(gap['accuracy'], digits=2, sign='+')} | "
            f"{table['bless_served']}/{runs} | {'yes' if table['goal_met'] else '**no**'} | "
            f"{table['train_s']['mean']:.0f} (max {table['train_s_max']:.0f}) |")


def _one_line(text: str, limit: int = 400) -> str:
    """An error's tail as one Markdown-safe line."""
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else "…" + flat[-limit:]


def render_tables(results: dict[str, dict]) -> list[str]:
    """bench/bench_tables.py: the served model vs the baseline cross-validation picks, one row per table."""
    result = _need(results, "tables")
    per_table = result["figures"]["per_table"]
    lines = [f"**{result['title']}** ({_when(result)}; goal: {result['goal']}). Holdout macro-F1 / accuracy, "
             "mean ± 95% interval over seeds; gap = baseline minus served, in points, paired per seed (positive = "
             "served behind).", "",
             "| table | rows | classes | seeds | served: macro-F1 / accuracy (family) | baseline: macro-F1 / "
             "accuracy (picked) | gap (points) | bless served | met | train s (max) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_table_row(name, table) for name, table in per_table.items()]
    if result["notes"].startswith("PARTIAL"):
        lines += ["", f"*{result['notes'].split('. ')[0]}.*"]
    return lines


def render_serving(results: dict[str, dict]) -> list[str]:
    """bench/bench_serving.py: the servers side by side per table."""
    result = _need(results, "serving")
    lines = [f"**{result['title']}** ({_when(result)}; goal: {result['goal']}). Medians over rounds.", "",
             "| table | server | requests/s | p50 ms | p99 ms | RSS MiB: worker (all processes) | errors |",
             "|---|---|---|---|---|---|---|"]
    for table, servers in result["figures"]["serving_tables"].items():
        for server, f in servers.items():
            lines.append(f"| {table} | {server} | {f['requests_per_s']:,.0f} | {f['p50_us'] / 1e3:.2f} | "
                         f"{f['p99_us'] / 1e3:.2f} | {f['rss_mib']:.0f} ({f.get('tree_rss_mib', f['rss_mib']):.0f}) | "
                         f"{f['errors']} |")
    return lines


def _servers(results: dict[str, dict]) -> dict[str, dict[str, dict]]:
    return _need(results, "serving")["figures"]["serving_tables"]


def render_serving_ratios(results: dict[str, dict]) -> list[str]:
    """How many times the minimal app's and mlflow models serve's requests/s torchship answered, per table."""
    parts = []
    for table, s in _servers(results).items():
        mine = s["torchship"]
        parts.append(f"{table}: {mine['requests_per_s'] / s['minimal']['requests_per_s']:.1f}× the minimal app's "
                     f"requests/s and {mine['requests_per_s'] / s['mlflow']['requests_per_s']:.0f}× "
                     f"`mlflow models serve`'s, worker RSS {mine['rss_mib']:.0f} MiB against MLflow's "
                     f"{s['mlflow']['rss_mib']:.0f} MiB")
    return [f"torchship's service ({_when(results['serving'])}): " + "; ".join(parts) + "."]


def render_workers(results: dict[str, dict]) -> list[str]:
    """What `serve.workers: 2` bought over one worker, per table (same run, same load)."""
    parts = []
    for table, s in _servers(results).items():
        one, two = s["torchship"], s["torchship-2w"]
        parts.append(f"{table} {two['requests_per_s'] / one['requests_per_s']:.2f}× the requests/s at "
                     f"{two['tree_rss_mib'] / one['tree_rss_mib']:.1f}× the memory (all processes), p99 "
                     f"{one['p99_us'] / 1e3:.2f} → {two['p99_us'] / 1e3:.2f} ms")
    return [f"Two workers against one ({_when(results['serving'])}, `bench/bench_serving.py`): "
            + "; ".join(parts) + "."]


def render_bless(results: dict[str, dict]) -> list[str]:
    """The staged bless's time and its latency spread run to run (bench/bench_bless.py)."""
    result = _need(results, "bless")
    f = result["figures"]
    return [f"On the default data bless took {f['bless_s']} s with no champion ({f['bless_share_pct']}% of the "
            f"pipeline) and {f['bless_with_champion_s']} s against a champion ({f['share_with_champion_pct']}%); "
            f"the candidate's batch-1 p50 varied {f['candidate_p50_ms_cv_pct']}% (coefficient of variation) over "
            f"{len(f['runs'])} runs ({_when(result)})."]


def render_load(results: dict[str, dict]) -> list[str]:
    """bench/bench_load.py: memory and descriptors before and after a sustained load."""
    result = _need(results, "load")
    f, b = result["figures"], result["baseline"]
    return [f"Under sustained load (`bench/bench_load.py`, {_when(result)}): {f['requests']:,} requests, RSS "
            f"{f['rss_before_mib']:.0f} → {f['rss_after_mib']:.0f} MiB ({f['rss_growth_pct']:+.2f}%; the minimal "
            f"app {b['minimal rss_growth_pct']:+.2f}%), open descriptors {f['fds_before']} → {f['fds_after']}, "
            f"{f['non2xx']} non-2xx answers."]


def _pipeline_rows(results: dict[str, dict]) -> list[str]:
    result = _need(results, "pipeline")
    f = result["figures"]
    install = "install included" if f["install_included"] else "install skipped (an existing venv)"
    inside = f" ({f['first_flow_s']:.0f} s inside the flow)" if f.get("first_flow_s") else ""
    rerun_inside = f" ({f['rerun_flow_s']:.0f} s inside the flow)" if f.get("rerun_flow_s") else ""
    return [f"| `make pipeline` on a fresh clone | {f['first_run_s']:.0f} s{inside}, {install} | {_when(result)} |",
            f"| `make pipeline` again, nothing changed | {f['rerun_s']:.0f} s{rerun_inside} | {_when(result)} |",
            f"| disk used by the clone afterwards | {f['disk_mib']:,.0f} MiB | {_when(result)} |",
            f"| largest process (peak RSS) | {f['peak_rss_mib']:,.0f} MiB | {_when(result)} |"]


def render_pipeline(results: dict[str, dict]) -> list[str]:
    """bench/bench_pipeline.py: a fresh clone's `make pipeline`, then the unchanged re-run."""
    try:
        rows = _pipeline_rows(results)
    except NotMeasured:
        rows = ["| `make pipeline` on a fresh clone, then again unchanged | not measured yet "
                "(`python bench/bench_pipeline.py`) | — |"]
    return ["| what | figure | measured |", "|---|---|---|", *rows]


def render_pipeline_output(results: dict[str, dict]) -> list[str]:
    """What a fresh clone's `make pipeline` and its unchanged re-run printed at the end, as recorded."""
    result = _need(results, "pipeline")
    f = result["figures"]
    if not f.get("first_summary"):
        raise NotMeasured("pipeline")
    return [f"The end of the first run ({_when(result)}):", "", "```", f["first_summary"], "```", "",
            "And of the unchanged re-run:", "", "```", f["rerun_summary"], "```"]


def render_headline(results: dict[str, dict]) -> list[str]:
    """The README's few figures: the pipeline's time and the service's requests/s."""
    lines = render_pipeline(results)
    try:
        s = _servers(results)["default"]
        lines.append(f"| `torchship serve`, one row per request, default data | "
                     f"{s['torchship']['requests_per_s']:,.0f} requests/s, p99 {s['torchship']['p99_us'] / 1e3:.2f} ms "
                     f"(a minimal FastAPI + ONNX Runtime app: {s['minimal']['requests_per_s']:,.0f}) | "
                     f"{_when(results['serving'])} |")
    except NotMeasured:
        lines.append("| `torchship serve` | not measured yet (`python bench/bench_serving.py`) | — |")
    return lines


def render_estimate(results: dict[str, dict]) -> list[str]:
    """bench/bench_estimate.py: the label-free accuracy estimate against the realised accuracy, per shift."""
    result = _need(results, "estimate")
    f = result["figures"]
    lines = [f"**{result['title']}** ({_when(result)}; goal: {result['goal']}). Accuracy, mean over the windows; "
             "|error| = mean |estimated - actual| per window, in points.", "",
             "| windows | shift | estimated | actual | \\|error\\| | served probabilities alone | raw model alone |",
             "|---|---|---|---|---|---|---|"]
    for name, case in f["cases"].items():
        monitor, (table, _, strength) = case["monitor"], name.rsplit(" ", 2)
        lines.append(f"| {table} | {case['kind']} {strength} | {monitor['estimated']:.4f} "
                     f"| {monitor['actual']:.4f} | {100 * monitor['mean_abs_error']:.2f} | "
                     f"{100 * case['tempered']['mean_abs_error']:.2f} | {100 * case['raw']['mean_abs_error']:.2f} |")
    calibration = "; ".join(f"{name} {c['unseen_rows_before']:.4f} → {c['unseen_rows_after']:.4f}"
                            + (f" (temperature {c['fitted_on_validation']['temperature']:.3g})"
                               if c["fitted_on_validation"]["temperature"] != 1.0 else " (no temperature needed)")
                            for name, c in f["calibration"].items())
    return lines + ["", f"Mean |error| under covariate shift {100 * f['covariate_mean_abs_error']:.2f} points (worst "
                        f"shift {100 * f['covariate_worst_shift_error']:.2f}); under concept shift, the known limit, "
                        f"{100 * f['concept_mean_abs_error']:.2f}. Expected calibration error on unseen rows, before → "
                        f"after calibration: {calibration}."]


def render_summary(results: dict[str, dict]) -> list[str]:
    """Every result on one line: what was measured, against what, the ratio and the goal; then the notes."""
    lines = ["| benchmark | torchship | baseline (same run) | ratio | goal | met | measured |",
             "|---|---|---|---|---|---|---|"]
    ordered = [results[name] for name in sorted(results)]
    for r in ordered:
        met = {True: "yes", False: "**no**", None: "—"}[r.get("goal_met")]
        lines.append(f"| {r['title']} | {_figure(r['figures'])} | {_figure(r['baseline'])} | {r['ratio']}x | "
                     f"{r['goal']} | {met} | {_when(r)} |")
    lines += ["", "How each was measured:", ""]
    lines += [f"- *{r['title']}* (`bench/results/{r['name']}.json`): {r['notes']}" for r in ordered if r.get("notes")]
    return lines


def render_stack(results: dict[str, dict]) -> list[str]:
    """bench/bench_stack.py: the team stack's up and down times and each part's memory."""
    result = _need(results, "stack")
    f = result["figures"]
    parts = ", ".join(f"{name} {mib:,} MiB (PSS {f['pss_mib'].get(name, 0):,})" for name, mib in f["rss_mib"].items())
    workers = f"{f['workers']} worker" + ("" if f["workers"] == 1 else "s")
    return [f"Measured by `bench/bench_stack.py` ({_when(result)}, load average {f['load_average_at_start']} at the "
            f"start): a first `up` with {workers} took {f['first_up_s']:.0f} s, `down` "
            f"{f['down_s']:.0f} s, and `up` again {f['up_again_s']:.0f} s. Resident memory while idle: {parts}; "
            f"{f['total_rss_mib']:,} MiB of RSS in all, which counts PostgreSQL's shared memory in each of its "
            f"processes; {f['total_pss_mib']:,} MiB of PSS, which counts it once."]


def render_team_pipeline(results: dict[str, dict]) -> list[str]:
    """bench/bench_team_pipeline.py: `torchship run` on the team stack vs the embedded default, side by side. Beside
    the JSON's ratio (means), the fastest run of each side (noise on a shared box only adds time) and the steps that
    talk to the servers most."""
    result = _need(results, "team_pipeline")
    f = result["figures"]
    fastest = {side: min(run["wall_s"] for run in runs) for side, runs in f["runs"].items()}
    steps = ", ".join(f"{step} {f['steps_s']['stack'][step]:.1f} vs {f['steps_s']['embedded'][step]:.1f} s"
                      for step in ("validate", "register", "canary") if step in f["steps_s"]["stack"])
    peaks = ", ".join(f"{name} {mib:,.0f}" for name, mib in f["peak_rss_mib"].items())
    return [f"Measured by `bench/bench_team_pipeline.py` ({_when(result)}; {f['rows']:,} rows of the synthetic "
            f"default, runs in the order embedded, stack, stack, embedded): `torchship run` took "
            f"{f['stack_wall_s']:.0f} s on the stack and {f['embedded_wall_s']:.0f} s embedded (means), "
            f"**{result['ratio']:.2f}x** (goal: {result['goal']}); the fastest run of each side "
            f"{fastest['stack']:.0f} vs {fastest['embedded']:.0f} s, "
            f"**{fastest['stack'] / fastest['embedded']:.2f}x**. Steps that talk to the servers most, stack vs "
            f"embedded (means): {steps}. Peak RSS of the stack's parts during the runs, MiB: {peaks} "
            f"({f['peak_rss_total_mib']:,.0f} in all).",
            "",
            "Per run (wall seconds, and the train step's, which the machine's load moves most): " + "; ".join(
                f"{side} {run['wall_s']:.0f} (train {run['steps_s'].get('train', 0):.0f}, load {run['load_1m_at_end']})"
                for side, runs in f["runs"].items() for run in runs) + "."]


def render_images(results: dict[str, dict]) -> list[str]:
    """bench/bench_images.py: held-out accuracy of the served image model beside the pixel baselines, per set."""
    result = _need(results, "images")
    f = result["figures"]
    lines = [f"**{result['title']}** ({_when(result)}; goal: {result['goal']}).", "",
             "| set | holdout images | served accuracy | pixel logistic regression | served − pixels (95% CI) | "
             "majority class |", "|---|---|---|---|---|---|"]
    for name in ("digits", "shapes"):
        q = f[name]
        gap = q["logistic_regression_pixels"]["served_minus_baseline_accuracy"]
        lines.append(f"| {name} | {q['holdout_images']:,} | {q['served']['accuracy']:.4f} | "
                     f"{q['logistic_regression_pixels']['accuracy']:.4f} | {gap['difference']:+.4f} "
                     f"({gap['low']:+.4f} to {gap['high']:+.4f}) | {q['majority_class']['accuracy']:.4f} |")
    return lines


def render_image_compression(results: dict[str, dict]) -> list[str]:
    """bench/bench_images.py: the int8 and student variants' size and accuracy beside the fp32 teacher."""
    result = _need(results, "images")
    lines = [f"Compressed image models ({_when(result)}, `bench/bench_images.py`: each set's default run):", "",
             "| set | variant | size KiB | holdout accuracy | within the budget |", "|---|---|---|---|---|"]
    for name in ("digits", "shapes"):
        for variant, v in result["figures"][name]["compression"].items():
            size = f"{v['bytes'] / 1024:,.0f}" if v.get("bytes") else "-"
            lines.append(f"| {name} | {variant} | {size} | {v['accuracy']:.4f} | "
                         f"{'reference' if variant == 'fp32' else 'yes' if v['publishable'] else 'no'} |")
    return lines


def render_image_speed(results: dict[str, dict]) -> list[str]:
    """bench/bench_images.py: the train stage against a plain loop, and the pipeline's time against the table's."""
    result = _need(results, "images")
    t, p = result["figures"]["training"], result["figures"]["pipeline"]
    return [f"Image training ({_when(result)}, `bench/bench_images.py`, the shapes splits): the train stage "
            f"{t['samples_per_s']:,} samples/s against a plain PyTorch loop of the same CNN's "
            f"{t['plain_samples_per_s']:,} ({t['ratio']:.2f}×; goal ≥ 0.95×). The pipeline on `images:digits` took "
            f"{p['digits_s']:.0f} s against {p['table_s']:.0f} s for the tabular default in the same run "
            f"({p['ratio']:.2f}×; goal ≤ 1.5×)."]


def render_image_serving(results: dict[str, dict]) -> list[str]:
    """bench/bench_serving.py --tables images --save-as image_serving: one image per request, three servers."""
    result = _need(results, "image_serving")
    lines = [f"**One PNG per request** ({_when(result)}; `bench/bench_serving.py --tables images --save-as "
             f"image_serving`; goal: {result['goal']}). Medians over rounds.", "",
             "| server | images/s | p50 ms | p99 ms | RSS MiB: worker (all processes) | errors |",
             "|---|---|---|---|---|---|"]
    for server, f in result["figures"]["serving_tables"]["images"].items():
        lines.append(f"| {server} | {f['requests_per_s']:,.0f} | {f['p50_us'] / 1e3:.2f} | {f['p99_us'] / 1e3:.2f} | "
                     f"{f['rss_mib']:.0f} ({f.get('tree_rss_mib', f['rss_mib']):.0f}) | {f['errors']} |")
    return lines


def render_image_limits(results: dict[str, dict]) -> list[str]:
    """bench/bench_image_limits.py: the 6,300 x 6,300 black PNG refused unread at the defaults, decoded off the event
    loop with its limit raised, and (when measured) on the code before these limits."""
    result = _need(results, "image_limits")
    figures, before = result["figures"], result["baseline"].get("before")
    refused, decoded = figures["refused"], figures["decoded"]
    lines = [f"**A {figures['pixels']:,}-pixel black PNG of {figures['file_bytes'] / 1024:.0f} KiB** "
             f"({_when(result)}, `bench/bench_image_limits.py`, the real service on a {figures['model']} model; "
             f"goal: {result['goal']}).", "",
             "| case | status | time to the answer | /health meanwhile: median / worst | peak RSS growth |",
             "|---|---|---|---|---|",
             f"| defaults: alone / a hundred in one body | {', '.join(map(str, refused['statuses']))} | "
             f"{refused['alone_ms']:.0f} / {refused['hundred_ms']:.0f} ms | — | {refused['rss_growth_mb']:.0f} MB |"]
    for case, run in (("limit raised: decoded in the thread pool", decoded),
                      ("before these limits: decoded on the event loop", before)):
        if run:
            lines.append(f"| {case} | {run['status']} | {run['decode_ms']:,.0f} ms | {run['health_median_ms']:.1f} / "
                         f"{run['health_max_ms']:,.0f} ms | {run['rss_growth_mb']:,.0f} MB |")
    return lines


def render_serving_parent(results: dict[str, dict]) -> list[str]:
    """bench/bench_serving_parent.py: the table /predict at this code beside the code before the hardening, in
    alternating rounds of bench/bench_serving.py on the same machine."""
    result = _need(results, "serving_parent")
    f = result["figures"]
    lines = [f"**The table hot path against the code before the hardening** ({_when(result)}; "
             f"`{result['baseline']['commit']}`, alternating rounds; goal: {result['goal']}).", "",
             "| round | before: requests/s | this code: requests/s | ratio | before: p99 ms | this code: p99 ms |",
             "|---|---|---|---|---|---|"]
    for r, ratio in zip(f["rounds"], f["per_round_ratio"]):
        before, now = r["parent"]["torchship"], r["this"]["torchship"]
        lines.append(f"| {r['round'] + 1} | {before['requests_per_s']:,.0f} | {now['requests_per_s']:,.0f} | "
                     f"{ratio:.2f} | {before['p99_us'] / 1e3:.1f} | {now['p99_us'] / 1e3:.1f} |")
    lines += ["", f"Median {f['this_rps_median']:,.0f} against {f['parent_rps_median']:,.0f} requests/s "
                  f"({result['ratio']:.2f}×); against the minimal FastAPI app of the same rounds "
                  f"{f['this_vs_minimal_median']:.2f}× against {f['parent_vs_minimal_median']:.2f}×."]
    return lines


TEXT_SETS = {"tweets": "`text:tweets`", "tickets": "`text:tickets`"}


def render_text_quality(results: dict[str, dict]) -> list[str]:
    """bench/bench_text.py: held-out macro-F1 of the served text model beside TF-IDF + logistic regression, per set."""
    result = _need(results, "text")
    f = result["figures"]
    lines = [f"**{result['title']}** ({_when(result)}; goal: {result['goal']}).", "",
             "| set | texts: training / holdout | served model | served macro-F1 | TF-IDF + logistic regression | "
             "served − TF-IDF (95% CI) | majority class | within 1 point |", "|---|---|---|---|---|---|---|---|"]
    for name, label in TEXT_SETS.items():
        q = f[name]
        held, gap = q[q["held_to"]], q[q["held_to"]]["served_minus_baseline_f1_macro"]
        weights = "class-balanced" if q["held_to"].endswith("_balanced") else "unweighted"
        lines.append(f"| {label} | {q['train_texts']:,} / {q['holdout_texts']:,} | {q['trained']['model']} "
                     f"({q['compression']['served_variant']}) | {q['served']['f1_macro']:.4f} | "
                     f"{held['f1_macro']:.4f} ({weights}) | {gap['difference'] * 100:+.2f} points "
                     f"({gap['low'] * 100:+.2f} to {gap['high'] * 100:+.2f}) | {q['majority_class']['f1_macro']:.4f} | "
                     f"{'yes' if f['goals'][f'{name}_served_within_1_point'] else 'no'} |")
    return lines


def render_text_compression(results: dict[str, dict]) -> list[str]:
    """bench/bench_text.py: the dynamic int8 and student variants' size and macro-F1 beside the fp32 teacher."""
    result = _need(results, "text")
    lines = [f"Compressed text models ({_when(result)}, `bench/bench_text.py`: each set's default run; the served "
             "variant is profile's pick):", "",
             "| set | variant | size KiB | holdout macro-F1 | within the budget | served |",
             "|---|---|---|---|---|---|"]
    for name, label in TEXT_SETS.items():
        variants = result["figures"][name]["compression"]
        served = variants["served_variant"]
        for variant, v in variants.items():
            if variant == "served_variant":
                continue
            size = f"{v['bytes'] / 1024:,.0f}" if v.get("bytes") else "-"
            score = f"{v['f1_macro']:.4f}" if "f1_macro" in v else f"not built: {_one_line(v.get('error', ''), 80)}"
            budget = "reference" if variant == "fp32" else "yes" if v["publishable"] else "no"
            named = {"fp32": "onnx-fp32"}.get(variant, variant)   # profile names the teacher's file so
            lines.append(f"| {label} | {variant} | {size} | {score} | {budget} | {'yes' if served == named else ''} |")
    return lines


def render_text_speed(results: dict[str, dict]) -> list[str]:
    """bench/bench_text.py: the train stage against a plain loop, and the pipeline's time against the table's."""
    result = _need(results, "text")
    t, p = result["figures"]["training"], result["figures"]["pipeline"]
    return [f"Text training ({_when(result)}, `bench/bench_text.py`, the tweets splits, `{t['model']}`, batch "
            f"{t['settings']['batch_size']}, {t['settings']['threads']} thread): the train stage "
            f"{t['samples_per_s']:,} samples/s against a plain PyTorch loop of the same Transformer's "
            f"{t['plain_samples_per_s']:,} ({t['ratio']:.2f}×; goal ≥ 0.95×); with attention dropout 0.1 (off by "
            f"default) the stage ran {t['attention_dropout']['samples_per_s']:,}. The pipeline on `text:tweets` took "
            f"{p['tweets_s']:.0f} s against {p['table_s']:.0f} s for the tabular default in the same run "
            f"({p['ratio']:.2f}×; goal ≤ 1.5×)."]


def render_text_serving(results: dict[str, dict]) -> list[str]:
    """bench/bench_text_serving.py: raw strings per request, three servers on the same registered text version."""
    result = _need(results, "text_serving")
    f = result["figures"]
    agree = ", ".join(f"{server} {gap:.1e}" for server, gap in f["max_probability_difference"].items())
    lines = [f"**{f['texts_per_request']} text(s) per request** ({_when(result)}; `bench/bench_text_serving.py`, "
             f"{f['model']}; goal: {result['goal']}). Medians over rounds. Each server's probabilities for the same "
             f"texts against ONNX Runtime's on the registered file, largest difference: {agree}.", "",
             "| server | texts/s | p50 ms | p99 ms | RSS MiB: worker (all processes) | errors |",
             "|---|---|---|---|---|---|"]
    for server, s in f["servers"].items():
        lines.append(f"| {server} | {s['texts_per_s']:,.0f} | {s['p50_us'] / 1e3:.2f} | {s['p99_us'] / 1e3:.2f} | "
                     f"{s['rss_mib']:.0f} ({s['tree_rss_mib']:.0f}) | {s['errors']} |")
    return lines


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def render_gpu(results: dict[str, dict]) -> list[str]:
    """bench/gpu_check.py: the targets, then every variant (ran, or skipped and why), then where the default data's
    stage spent its time outside the epochs. A CPU-mode file says so first: its figures are no GPU's."""
    if "gpu" not in results:   # the goals, so that the page says what a GPU run will be judged on
        sys.path.insert(0, str(ROOT))
        from bench.gpu_report import TARGETS

        return ["*Not measured yet: no GPU has run `bench/gpu_check.py`, so bench/results/ holds no gpu.json.* "
                "Its targets:", "", "| target | goal |", "|---|---|",
                *(f"| {what} | {goal} |" for what, goal, _ in TARGETS.values())]
    result = results["gpu"]
    machine = result["machine"]
    where = (f"{machine.get('cuda')}, {machine.get('gpu_memory_gib')} GiB, torch {machine['torch']}, CUDA "
             f"{machine.get('cuda_runtime')}" if result["mode"] == "gpu" else
             f"**CPU mode only** (a tiny MLP on 3,000 rows: the plumbing, no GPU figure), torch {machine['torch']}")
    lines = [f"**{result['title']}** ({_when(result)}; {where}; {result['figures']['elapsed_s']:.0f} s).", "",
             "| target | measured | goal | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {_cell(t['measured'])} | {t['goal']} | {_cell(t['met'])} |"
              for t in result["targets"]]
    lines += ["", "| variant | status | batch | samples/s (steady) | epoch 1 / later | outside epochs, s | val F1 | "
              "peak GPU MiB | notes |", "|---|---|---|---|---|---|---|---|---|"]
    for v in result["variants"]:
        f = v.get("figures", {})
        rate = f.get("steady_samples_per_s", f.get("samples_per_s"))
        notes = v.get("reason") or "; ".join(f.get("notes") or []) or f.get("headline") or ""
        lines.append(f"| {v['name']} | {v['status']} | {_cell(f.get('batch_size', f.get('batch')))} | "
                     f"{_cell(rate and round(rate))} | {_cell(f.get('first_epoch_ratio'))} | "
                     f"{_cell(f.get('outside_epochs_s'), 1)} | {_cell(f.get('val_f1_at_argmax'), 4)} | "
                     f"{_cell(f.get('peak_device_memory_mb'), 0)} | {_one_line(str(notes), 200)} |")
    ran = {v["name"]: v for v in result["variants"] if v["status"] == "ran"}
    for name in ("ddp-bf16", "ddp-fp32"):
        if name in ran:
            parts = ", ".join(f"{part} {seconds:.1f}" for part, seconds in ran[name]["figures"]
                              ["outside_breakdown_s"].items())
            lines += ["", f"Outside the epochs ({name}, seconds): {parts}."]
            break
    return lines


def render_sweep(results: dict[str, dict]) -> list[str]:
    """bench/bench_sweep.py: the search's winner vs the default configuration on the untouched holdout, its
    optimism and the baseline cross-validation picks, one row per set; then trials per hour, two workers vs one."""
    result = _need(results, "sweep")
    f = result["figures"]
    config = f["config"]
    seeds = max(s["seeds"] for s in f["sets"].values())
    planned = "" if seeds == config["seeds"] else f" of {config['seeds']} planned"
    ran = (f"{config['trials']} trials a study, {seeds} seed(s){planned}, sets {', '.join(config['sets'])}; "
           f"bench wall {f['wall_s'] / 60:.0f} min" + ("; a reduced run" if config["reduced"] else ""))
    lines = [f"**{result['title']}** ({_when(result)}; {ran}; goal: {result['goal']}). Holdout macro-F1, mean ± 95% "
             "interval over seeds; winner minus default paired per seed (points), with the seeds whose paired "
             "bootstrap interval lies wholly below 0; optimism = the winner's validation score minus its holdout "
             "score (points).", "",
             "| set | holdout rows | default | winner | winner − default | default better (seeds) | optimism | "
             "CV-picked baseline | met |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in f["sets"].items():
        lines.append(f"| {name} | {s['holdout_rows']:,} | {_ci(s['default'])} | {_ci(s['winner'])} | "
                     f"{_ci(s['gain'], 100, 2, '+')} | {s['default_significantly_better']}/{s['seeds']} | "
                     f"{_ci(s['optimism'], 100, 2, '+')} | {_ci(s['cv_baseline'])} ({s['cv_baseline_name']}) | "
                     f"{'yes' if s['met'] else '**no**'} |")
    scale = f.get("scale")
    if scale:
        when = f", measured {scale['measured_at'][:16]}" if "measured_at" in scale else ""
        earlier = scale.get("earlier") or []
        earlier = [earlier] if isinstance(earlier, dict) else earlier
        lines += ["", f"Trials per hour ({scale['set']}; {scale['trials']} trials each, one thread a trial, load "
                      f"average {scale['load_average'][0]:.1f} after{when}): one worker {scale['one']:.0f}, two "
                      f"workers {scale['two']:.0f} ({scale['ratio']:.2f}x; goal {scale['goal']:g}x on 2 cores)."
                  + ("".join(f" Measured before{' at ' + e['measured_at'][11:16] if 'measured_at' in e else ''} "
                             f"(load average {e['load_average'][0]:.1f}): one worker {e['one']:.0f}, two "
                             f"{e['two']:.0f} ({e['ratio']:.2f}x)." for e in earlier))]
    if not config["complete"]:
        why = (f"Stopped by its time budget ({config['budget_minutes']:g} min) before the next seed"
               if config.get("budget_minutes") else "A partial run")
        lines += ["", f"*{why}: " + ", ".join(f"{name} {s['seeds']}/{config['seeds']} seeds"
                                              for name, s in f["sets"].items()) + ".*"]
    return lines


RENDERERS: dict[str, Callable[[dict[str, dict]], list[str]]] = {
    "images": render_images, "image-compression": render_image_compression, "image-speed": render_image_speed,
    "image-serving": render_image_serving, "image-limits": render_image_limits,
    "text-quality": render_text_quality, "text-compression": render_text_compression, "text-speed": render_text_speed,
    "text-serving": render_text_serving, "serving-parent": render_serving_parent,
    "summary": render_summary, "serving": render_serving, "serving-ratios": render_serving_ratios,
    "workers": render_workers, "tables": render_tables, "bless": render_bless, "pipeline": render_pipeline,
    "headline": render_headline, "load": render_load, "estimate": render_estimate,
    "pipeline-output": render_pipeline_output, "stack": render_stack,
    "team-pipeline": render_team_pipeline, "gpu": render_gpu, "sweep": render_sweep}


def render_block(name: str, results: dict[str, dict]) -> str:
    """The text between a block's markers."""
    if name not in RENDERERS:
        raise KeyError(f"unknown block bench:{name}; known: {', '.join(sorted(RENDERERS))}")
    try:
        lines = RENDERERS[name](results)
    except NotMeasured as missing:
        lines = [f"*bench/results/{missing}.json: not measured yet (see bench/).*"]
    return "\n".join(lines) + "\n"


def check_markers(text: str, where: str) -> None:
    """Every start marker has its end, in order, with no block inside another."""
    opened = None
    for found in MARKER.finditer(text):
        name, edge = found.groups()
        if (edge == "start") == (opened is not None) or (edge == "end" and name != opened):
            raise ValueError(f"{where}: unbalanced marker <!-- bench:{name}:{edge} -->")
        opened = name if edge == "start" else None
    if opened:
        raise ValueError(f"{where}: <!-- bench:{opened}:start --> has no end marker")


def render_text(text: str, results: dict[str, dict], where: str = "text") -> str:
    """The text with every block rendered afresh."""
    check_markers(text, where)
    return BLOCK.sub(lambda m: m["start"] + "\n" + render_block(m["name"], results) + m["end"], text)


def stale_blocks(path: Path, results: dict[str, dict]) -> list[str]:
    """The blocks of one file whose text differs from what the results render now."""
    return [m["name"] for m in BLOCK.finditer(path.read_text()) if m["body"] != render_block(m["name"], results)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Change nothing; exit 1 naming every stale block.")
    args = parser.parse_args(argv)
    results, stale, blocks = load_results(), [], 0
    for path in doc_files():
        text = path.read_text()
        rendered = render_text(text, results, str(path.relative_to(ROOT)))
        blocks += len(BLOCK.findall(text))
        if args.check:
            stale += [f"{path.relative_to(ROOT)}: bench:{name}" for name in stale_blocks(path, results)]
        elif rendered != text:
            path.write_text(rendered)
    if stale:
        print("stale rendered blocks (run `python bench/render_table.py`):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'rendered'} {blocks} block(s) from {len(results)} result file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
