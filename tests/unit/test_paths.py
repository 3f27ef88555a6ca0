"""tasks/core/paths.py and the DVC stage list stay in step with dvc.yaml."""
from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML

from tasks.core import paths
from tasks.ops.reproduce import DVC_STAGES

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


def test_dvc_stages_follow_dvc_yaml_order():
    assert tuple(dvc_stages()) == DVC_STAGES


def test_each_stage_runs_its_own_module():
    for name, stage in dvc_stages().items():
        assert stage["cmd"] == f"python -m tasks.{name}"
        assert f"tasks/{name}.py" in stage["deps"]
