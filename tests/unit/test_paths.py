"""tasks/core/paths.py and the pipeline flow's steps stay in step with dvc.yaml (the one stage list)."""
from __future__ import annotations

import ast
from pathlib import Path

from ruamel.yaml import YAML

from tasks.core import paths
from tasks.stages import repro
from tasks.stages.plan import LIVE_STEPS

REPO = Path(__file__).resolve().parents[2]


def dvc_stages() -> dict:
    return YAML(typ="safe").load((REPO / "dvc.yaml").read_text())["stages"]


def entry_path(entry) -> str:
    """A dvc.yaml out is either 'path' or {'path': {options}}."""
    return entry if isinstance(entry, str) else next(iter(entry))


def layout_paths() -> set[str]:
    return {value.as_posix() for value in vars(paths).values() if isinstance(value, Path)}


def test_every_output_and_metric_is_a_layout_constant():
    declared = layout_paths()
    outputs = [entry_path(e) for stage in dvc_stages().values() for key in ("outs", "metrics", "plots")
               for e in stage.get(key, [])]
    assert outputs  # the parse found something
    assert sorted(set(outputs) - declared) == []


def test_every_data_dependency_is_a_layout_constant():
    deps = [d for stage in dvc_stages().values() for d in stage.get("deps", []) if d.startswith("data/")]
    assert deps and sorted(set(deps) - layout_paths()) == []


def test_stage_metrics_point_at_each_stages_metrics_file():
    stages = dvc_stages()
    assert set(paths.STAGE_METRICS) == set(stages)
    for name, path in paths.STAGE_METRICS.items():
        assert path.as_posix() in [entry_path(e) for e in stages[name].get("metrics", [])]


def flow_calls() -> list[ast.Call]:
    """The calls in the pipeline flow's body, in source order."""
    tree = ast.parse((REPO / "flows" / "pipeline.py").read_text())
    body = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "pipeline")
    calls = [node for node in ast.walk(body) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    return sorted(calls, key=lambda call: (call.lineno, call.col_offset))


def test_the_flow_calls_each_dvc_stage_once_in_dvc_yaml_order_then_the_prefect_only_steps():
    """The flow keeps one explicit call per step (STYLE); dvc.yaml is the one stage list they must match."""
    calls = flow_calls()
    names = [call.func.id for call in calls]
    asked_dvc = [call.args[0].value for call in calls if call.func.id == "dvc_stage"]
    assert repro.dvc_stages(REPO) == list(dvc_stages())
    assert asked_dvc == repro.pipeline_stages(REPO)
    # the stage torchship refreshes itself (check_source writes the fingerprint and records the stage) comes first
    refreshed = [stage for stage in repro.dvc_stages(REPO) if stage not in asked_dvc]
    assert refreshed == list(repro.REFRESHED_BY_TORCHSHIP) == ["source"]
    assert names.index("check_source") < names.index("dvc_stage")
    prefect_only = [name.removesuffix("_step") for name in names if name.endswith("_step")]
    assert prefect_only == list(LIVE_STEPS)
    assert names.index("dvc_stage") < names.index(f"{LIVE_STEPS[0]}_step")


def test_each_stage_runs_its_own_module():
    for name, stage in dvc_stages().items():
        assert stage["cmd"] == f"python -m tasks.{name}"
        assert f"tasks/{name}.py" in stage["deps"]
