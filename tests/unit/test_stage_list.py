"""The one list of stages (dvc.yaml, then the Prefect-only steps): the flow runs them in that order, the summary's
headline comes from each stage's metrics file, and the docs' diagram and step table are rendered from it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tasks.stages import diagram
from tasks.stages.stage_list import (
    HEADLINE,
    PREFECT_STEPS,
    REFRESHED_BY_TORCHSHIP,
    dvc_stages,
    headline,
    metrics_file,
    pipeline_stages,
    read_dvc_stages,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def flow_calls() -> list[ast.Call]:
    """The calls in the pipeline flow's body, in source order."""
    tree = ast.parse((REPO / "flows" / "pipeline.py").read_text())
    body = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "pipeline")
    calls = [node for node in ast.walk(body) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    return sorted(calls, key=lambda call: (call.lineno, call.col_offset))


def test_the_flow_runs_dvc_yamls_stages_in_order_then_each_prefect_only_step_once():
    names = [call.func.id for call in flow_calls()]
    tree = ast.parse((REPO / "flows" / "pipeline.py").read_text())
    [loop] = [node for node in ast.walk(tree) if isinstance(node, ast.ListComp) and node.elt.func.id == "dvc_stage"]
    assert loop.generators[0].iter.func.id == "pipeline_stages"   # one dvc_stage call per stage, in dvc.yaml's order
    assert names.index("check_source") < names.index("dvc_stage")
    prefect_only = [name.removesuffix("_step") for name in names if name.endswith("_step")]
    assert prefect_only == [step.name for step in PREFECT_STEPS]
    assert names.index("dvc_stage") < names.index(f"{PREFECT_STEPS[0].name}_step")
    assert pipeline_stages(REPO) == [s for s in dvc_stages(REPO) if s not in REFRESHED_BY_TORCHSHIP]
    assert list(REFRESHED_BY_TORCHSHIP) == ["source"] == dvc_stages(REPO)[:1]


def test_every_stage_says_what_it_does_and_what_its_headline_says():
    for name, stage in read_dvc_stages(REPO).items():
        assert stage.get("desc"), f"{name}: no desc (the diagram's caption)"
        if name not in REFRESHED_BY_TORCHSHIP:
            assert (stage.get("meta") or {}).get("headline"), f"{name}: no meta.headline (the step table's row)"
            assert metrics_file(name, REPO) is not None, f"{name}: no metrics file to hold its headline"


def test_the_headline_is_the_metrics_files_headline_key(tmp_path):
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    assert headline("train", tmp_path) == ""                       # not run yet
    target = tmp_path / metrics_file("train", tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text(f'{{"{HEADLINE}": "val f1 0.68", "epochs": 5}}')
    assert headline("train", tmp_path) == "val f1 0.68"


def test_the_docs_blocks_are_what_the_stage_list_renders_now():
    stale = [name for name in diagram.DOCS
             if diagram.render_blocks((REPO / name).read_text(), REPO) != (REPO / name).read_text()]
    assert stale == [], f"run `torchship config-docs`: {stale}"
    assert all(diagram.BLOCK.search((REPO / name).read_text()) for name in diagram.DOCS)   # the scheme is in use


def test_the_diagram_shows_every_step_in_order_and_marks_where_prefect_takes_over():
    text = diagram.renderers(REPO)["diagram"]()
    order = [*dvc_stages(REPO), *(step.name for step in PREFECT_STEPS), "serve"]
    arrows = next(line for line in text.splitlines() if "─►" in line)
    assert [word for word in arrows.replace("─", " ").replace("►", " ").split()] == order
    header = text.splitlines()[1]
    assert header.index("Prefect-only") == arrows.index(PREFECT_STEPS[0].name)


def test_an_unknown_block_is_refused():
    with pytest.raises(KeyError, match="unknown generated block 'nope'"):
        diagram.render_blocks("<!-- generated:nope:start -->\n<!-- generated:nope:end -->", REPO)
