"""The docs stay true: figures rendered from bench/results, none typed by hand, a short README that links a guide for
each task people come with, links that resolve, headings without issue numbers."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bench import render_table
from tasks.core.env import http_retry_window_s

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GENERATED = {"docs/configuration.md"}      # written by `torchship config-docs` (its own test keeps it in step)
UNITS = (r"ms|µs|us|ns|s|sec|seconds?|min|minutes?|h|hours?|days?|req/s|requests/s|rows/s|samples/s|"
         r"[KMGT]iB|[KMGT]B|%|x|×")
# A number (not part of a name like p99 or k8s, nor a version like 3.11.7's tail) followed by a unit.
FIGURE = re.compile(rf"(?<![\w.\-/:])\d(?:[\d,.]*\d)?\s?(?:{UNITS})(?![\w/])(?!\s?\d)")
# The only figures allowed outside a rendered block: configuration defaults quoted in docs that other work owns,
# each checked against the file it quotes, so the quote cannot drift either.
QUOTED_DEFAULTS = {
    ("docs/deploy.md", "3600 s"): lambda: _monitor_interval_s() == 3600,
    ("docs/runbooks.md", "300 s"): lambda: _params()["train"]["collective_timeout_s"] == 300,
    **{(doc, figure): check for doc in ("docs/stack.md", "docs/deploy.md")
       for figure, check in (("60 s", lambda: _lock()["lease"] == 60), ("45 s", lambda: _lock()["renewed"] == 45),
                             ("120 s", lambda: _lock()["wait"] == 120), ("76 s", lambda: _lock()["bound"] == 76))},
    ("docs/stack.md", "66 s"): lambda: _lock()["stack_bound"] == 66,
    ("docs/deploy.md", "132 s"): lambda: http_retry_window_s() == 132,
    **{("docs/deploy.md", figure): check for figure, check in (("30 s", lambda: _crash_watch()["heartbeat"] == 30),
                                                               ("90 s", lambda: _crash_watch()["silence"] == 90),
                                                               ("125 s", lambda: _crash_watch()["bound"] == 125))},
}
# The six tasks people come with (../shared/JOURNEYS.md) and the guide the README's first 40 lines must link.
JOURNEY_GUIDES = {"try it": "docs/getting-started.md", "own data": "docs/own-data.md",
                  "promote by hand": "docs/registry.md", "deploy on Prefect": "docs/deploy.md",
                  "act on a 3 a.m. alert": "docs/runbooks.md", "run on the team's servers": "docs/deploy.md#"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def _lock() -> dict[str, float]:
    """The registry lock's figures (tasks/registry/lock.py), as the docs quote them: whole seconds, up."""
    import math

    from prefect.concurrency._leases import _RENEWAL_FRACTION
    from prefect.settings.models.server.services import ServerServicesRepossessorSettings

    from flows.cli.stack.servers import REPOSSESSOR_LOOP_S as STACK_LOOP_S
    from tasks.core.prefect_limits import LEASE_S, REPOSSESSOR_LOOP_S, dead_holder_bound_s
    from tasks.registry.lock import SERVER_LOCK_WAIT_S

    assert ServerServicesRepossessorSettings.model_fields["loop_seconds"].default == REPOSSESSOR_LOOP_S
    return {"lease": LEASE_S, "renewed": LEASE_S * _RENEWAL_FRACTION, "wait": SERVER_LOCK_WAIT_S,
            "bound": math.ceil(dead_holder_bound_s()), "stack_bound": math.ceil(dead_holder_bound_s(STACK_LOOP_S))}


def _crash_watch() -> dict[str, float]:
    """The figures of tasks/workspace/crash_watch.py the docs quote."""
    from tasks.workspace import crash_watch

    return {"heartbeat": crash_watch.HEARTBEAT_S, "silence": crash_watch.SILENCE_S,
            "bound": crash_watch.crashed_within_s()}


def _monitor_interval_s() -> float:
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    monitor = next(d for d in deployments if d["name"] == "monitor")
    return next(s["interval"] for s in monitor["schedules"] if "interval" in s)


def doc_files() -> list[Path]:
    return render_table.doc_files(REPO)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def outside_blocks(text: str) -> str:
    """The text with every rendered block's body blanked (line count kept, so line numbers still point right)."""
    return render_table.BLOCK.sub(lambda m: m["start"] + "\n" * (m["body"].count("\n") + 1) + m["end"], text)


def typed_figures(text: str, name: str) -> list[str]:
    """Figures with a unit outside rendered blocks, as `file:line: figure`, less the checked quoted defaults."""
    found = []
    for number, line in enumerate(outside_blocks(text).splitlines(), 1):
        for figure in FIGURE.findall(line):
            if (name, figure) not in QUOTED_DEFAULTS:
                found.append(f"{name}:{number}: {figure!r} in {line.strip()[:100]!r}")
    return found


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", strip_code(markdown), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def strip_code(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def test_every_rendered_block_is_what_its_results_render_now():
    results = render_table.load_results()
    stale = [f"{rel(path)}: bench:{name}" for path in doc_files() for name in render_table.stale_blocks(path, results)]
    assert not stale, f"figures differ from bench/results: run `python bench/render_table.py` ({stale})"
    assert sum(len(render_table.BLOCK.findall(p.read_text())) for p in doc_files()) >= 5   # the scheme is in use


def test_the_renderer_check_mode_agrees():
    assert render_table.main(["--check"]) == 0


def test_a_changed_result_makes_its_block_stale(tmp_path):
    results = render_table.load_results()
    page = tmp_path / "page.md"
    page.write_text(render_table.render_text("<!-- bench:bless:start -->\n<!-- bench:bless:end -->\n", results))
    assert render_table.stale_blocks(page, results) == []
    results["bless"] = {**results["bless"], "figures": {**results["bless"]["figures"], "bless_s": 99.9}}
    assert render_table.stale_blocks(page, results) == ["bless"]


def test_a_missing_result_renders_as_not_measured(tmp_path):
    text = render_table.render_text("<!-- bench:pipeline:start -->\n<!-- bench:pipeline:end -->\n", {})
    assert "not measured yet" in text
    assert "not measured yet" in render_table.render_block("bless", {})


def test_unbalanced_or_unknown_blocks_are_refused():
    with pytest.raises(ValueError, match="no end marker"):
        render_table.render_text("<!-- bench:bless:start -->\n", {})
    with pytest.raises(KeyError, match="unknown block"):
        render_table.render_text("<!-- bench:nope:start -->\n<!-- bench:nope:end -->\n", {})


def test_no_figure_with_a_unit_is_typed_outside_a_rendered_block():
    typed = [hit for path in doc_files() if rel(path) not in GENERATED
             for hit in typed_figures(path.read_text(), rel(path))]
    assert not typed, "render these from bench/results (or phrase them without a figure):\n" + "\n".join(typed)


def test_the_figure_rule_catches_what_it_should():
    assert typed_figures("the pipeline took 112 s, p99 2.6 ms, 17,224 req/s, 3.3x, 2.3%", "x.md") != []
    assert len(typed_figures("a 1 MiB tmpfs and 1.26× the rate", "x.md")) == 2
    assert typed_figures("p99 of v21, k8s, python 3.11, 2 cores, 512×512, `slo.p99_ms`", "x.md") == []
    assert typed_figures("<!-- bench:a:start -->\n112 s\n<!-- bench:a:end -->", "x.md") == []


def test_quoted_defaults_still_match_their_source():
    for (name, figure), holds in QUOTED_DEFAULTS.items():
        assert figure in (REPO / name).read_text(), f"{name} no longer quotes {figure!r}: drop it from the allowlist"
        assert holds(), f"{name} quotes {figure!r}, which its source no longer says"


def test_the_readme_is_short_and_links_a_guide_for_each_task_in_its_first_40_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines: move detail into docs/"
    top = [target for line in lines[:40] for target in LINK.findall(line)]
    for task, guide in JOURNEY_GUIDES.items():
        assert any(t == guide or (guide.endswith("#") and t.startswith(guide)) for t in top), \
            f"the README's first 40 lines do not link {guide} for {task!r}"


def test_every_relative_link_resolves_to_a_file_and_anchor():
    broken = []
    for path in doc_files():
        for target in LINK.findall(strip_code(path.read_text())):
            if re.match(r"[a-z]+:", target):
                continue                       # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{rel(path)} → {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{rel(path)} → {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_heading_names_an_issue_or_a_journey_number():
    bad = [f"{rel(path)}: {heading}" for path in doc_files()
           for heading in re.findall(r"^#{1,6}\s+.*$", strip_code(path.read_text()), flags=re.M)
           if re.search(r"#\d+|\bjourney\s*\d+|\bissue\s*\d+", heading, flags=re.I)]
    assert not bad, bad


def test_no_hand_kept_test_count():
    counted = [f"{rel(path)}: {m}" for path in doc_files()
               for m in re.findall(r"\b\d[\d,]*\s+tests\b", path.read_text())]
    assert not counted, counted


SUMMARY = """prepare  ran  4.3s  100,000 rows
                  torchship pipeline · synthetic-churn · 112s
│ prepare  │ ran         │ 4.3s  │ 100,000 rows, 11 features, 2 classes        │
Registry: registered v1 of synthetic-churn; aliases moved: champion none → v1.
"""


def test_the_pipeline_benchmark_plans_a_clone_and_two_runs(tmp_path):
    from bench import bench_pipeline

    fresh = bench_pipeline.plan_steps(REPO, tmp_path / "clone", None)
    assert [s.label for s in fresh] == ["clone", "first run", "re-run"]
    assert fresh[0].argv[:2] == ["git", "clone"] and fresh[1].argv == ["make", "pipeline"] == fresh[2].argv
    reused = bench_pipeline.plan_steps(REPO, tmp_path / "clone", tmp_path / "venv")
    assert reused[1].label == "link venv" and reused[1].argv[-1] == str(tmp_path / "clone" / ".venv")
    assert reused[2].argv == ["make", "-o", ".venv/.installed", "pipeline"]     # the install is not redone
    assert bench_pipeline.clone_env(tmp_path, tmp_path / "venv")["PYTHONPATH"] == str(tmp_path)


def test_the_pipeline_result_renders_in_every_pipeline_block():
    from bench import bench_pipeline

    figures = bench_pipeline.pipeline_figures({"first run": 227.4, "re-run": 17.0},
                                              {"first run": "installing…\n" + SUMMARY, "re-run": SUMMARY},
                                              True, 3210.0, 812.0, "0123456789abcdef", False)
    assert figures["first_flow_s"] == 112 and figures["install_included"]
    assert figures["first_summary"].splitlines()[0].strip().startswith("torchship pipeline ·")   # not the progress
    results = {"pipeline": {"name": "pipeline", "title": "t", "figures": figures, "baseline": {}, "ratio": 0.075,
                            "goal": "g", "goal_met": True, "measured_at": "2026-12-01 16:00:00",
                            "machine": {"cores": 2}}}
    table = render_table.render_block("headline", results)
    assert "227 s (112 s inside the flow), install included" in table and "| 17 s" in table
    assert "3,210 MiB" in render_table.render_block("pipeline", results)
    assert "Registry: registered v1" in render_table.render_block("pipeline-output", results)
    assert "\n" not in render_table.render_summary(results)[2]    # console text stays out of the summary row


def test_the_pipeline_benchmark_dry_run_runs_nothing(capsys):
    from bench import bench_pipeline

    result = REPO / "bench" / "results" / "pipeline.json"
    before = result.read_bytes() if result.exists() else None
    bench_pipeline.main(["--dry-run"])
    printed = capsys.readouterr().out
    assert "git clone" in printed and printed.count("make pipeline") == 2
    assert (result.read_bytes() if result.exists() else None) == before


# A repository path as the docs name one: a top-level file, or a path under a code or docs folder. Data paths are
# what the stages write (absent from a clone) and are checked against dvc.yaml by tests/unit/test_paths.py.
REPO_PATH = re.compile(r"(?<![\w./-])((?:tasks|flows|serving|models|tests|bench|docs|\.ci)/[\w./-]*[\w/]|"
                       r"(?:dvc|params|prefect)\.yaml|pyproject\.toml|Makefile)(?![\w<{*])")
MODULE = re.compile(r"(?<![\w./])((?:tasks|flows|serving|models)(?:\.[a-z_]\w*)+)")
ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w/&])#\d+\b(?![-\w])", re.I)


def docstrings() -> list[tuple[str, str]]:
    """(file, docstring) of every module, class and function in the project's code, benchmarks and tests."""
    import ast

    found = []
    for folder in ("tasks", "flows", "serving", "models", "bench", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        text := ast.get_docstring(node, clean=False)):
                    found.append((rel(path), text))
    return found


def named_paths(text: str) -> list[str]:
    return [match.rstrip(".") for match in REPO_PATH.findall(text)]


def missing_module(dotted: str) -> bool:
    """Whether `tasks.core.paths[.NAME]` names no project module (or a name the module does not hold). A doc link
    (`serving.md`) and a placeholder (`tasks.x`) are no module names."""
    parts = dotted.split(".")
    if dotted.endswith(".md") or any(len(part) == 1 for part in parts):
        return False
    for end in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:end])
        found = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if found.exists():
            rest = parts[end:]
            return bool(rest) and not re.search(rf"\b{rest[0]}\b", found.read_text())
    return True


def not_measured_yet(path: str) -> bool:
    """A benchmark's result file a script writes and no run has made yet (its blocks say "not measured yet"; a GPU
    check, say, runs only where a GPU is): named before it exists, and still a true name."""
    return path.startswith("bench/results/") and path.endswith(".json")


def test_every_repository_path_and_module_the_docs_and_docstrings_name_exists():
    texts = [(rel(path), strip_code_spans_of_output(path.read_text())) for path in doc_files()] + docstrings()
    missing = sorted({f"{name}: {found}" for name, text in texts for found in named_paths(text)
                      if not (REPO / found).exists() and not not_measured_yet(found)}
                     | {f"{name}: {dotted}" for name, text in texts for dotted in MODULE.findall(text)
                        if missing_module(dotted)})
    assert not missing, "\n".join(missing)


def strip_code_spans_of_output(text: str) -> str:
    """The doc without the blocks bench/render_table.py renders (console output of a run: no paths to check)."""
    return outside_blocks(text)


def test_the_path_rule_catches_what_it_should():
    assert named_paths("see `tasks/core/paths.py`, tasks/ops/reproduce.py and dvc.yaml.") == [
        "tasks/core/paths.py", "tasks/ops/reproduce.py", "dvc.yaml"]
    assert named_paths("tasks/<step>.py, tests/{unit,data}/, data/prepare/train.parquet, https://x.io/tasks/a") == []
    assert missing_module("tasks.core.paths") is False and missing_module("tasks.core.paths.DATA") is False
    assert missing_module("tasks.ops.reproduce") and missing_module("tasks.core.paths.NOPE")


def test_no_doc_or_docstring_cites_an_issue_number():
    """A reader cannot see the tracker: the reason goes in the text, not a number pointing at it."""
    texts = [(rel(path), path.read_text()) for path in doc_files()] + docstrings() + [
        (name, (REPO / name).read_text()) for name in ("params.yaml", "dvc.yaml", "prefect.yaml", "Makefile")]
    cited = [f"{name}: {match}" for name, text in texts for match in ISSUE.findall(text)]
    assert not cited, cited


def test_the_issue_rule_catches_what_it_should():
    assert ISSUE.findall("as issue 21 found; see issue #23 and #40") == ["issue 21", "issue #23", "#40"]
    assert ISSUE.findall("[shared state](docs/deploy.md#4-reaching-shared-state), color #ccc, v21, p99") == []
