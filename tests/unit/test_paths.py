"""Where the stages write: each stage under its own folder, data/<stage>/, as dvc.yaml declares it (the one stage
list), and tasks/core/paths.py's names for those files in step with it."""
from __future__ import annotations

from pathlib import Path

from tasks.core import paths
from tasks.stages.stage_list import entry_path, read_dvc_stages, stage_folder

REPO = Path(__file__).resolve().parents[2]


def layout_paths() -> set[str]:
    return {value.as_posix() for value in vars(paths).values() if isinstance(value, Path)}


def outputs(stage: dict) -> list[str]:
    return [entry_path(e) for key in ("outs", "metrics", "plots") for e in stage.get(key, [])]


def test_each_stage_writes_under_its_own_folder():
    stages = read_dvc_stages(REPO)
    assert outputs(stages["prepare"])   # the parse found something
    for name, stage in stages.items():
        folder = paths.SOURCE_FINGERPRINT.parent if name == "source" else stage_folder(name)
        outside = [out for out in outputs(stage) if Path(out).parent != folder and folder not in Path(out).parents]
        assert outside == [], f"{name} writes outside {folder}/"


def test_every_data_dependency_is_what_a_stage_or_torchship_writes():
    stages = read_dvc_stages(REPO)
    written = {out for stage in stages.values() for out in outputs(stage)}
    deps = {d for stage in stages.values() for d in stage.get("deps", []) if d.startswith("data/")}
    assert deps and sorted(deps - written - {paths.SOURCE_FINGERPRINT.as_posix()}) == []


def test_the_layout_names_the_files_dvc_yaml_declares():
    """What code reads or writes under a stage's folder is a name in tasks/core/paths.py, and dvc.yaml declares it
    (or it lies under one of the stage's declared folders); nothing in paths.py is a stage file dvc.yaml forgot."""
    stages = read_dvc_stages(REPO)
    declared = {out for stage in stages.values() for out in outputs(stage)}
    stage_files = {p for p in layout_paths() if any(Path(p).parent == stage_folder(name) for name in stages)}
    runtime = {paths.TRAIN_LOGS.as_posix(), paths.STUDENT_LOGS.as_posix()}   # each worker's output: no DVC out
    assert sorted(f for f in stage_files - runtime if f not in declared
                  and not any(Path(f).is_relative_to(d) for d in declared)) == []
    for name in stages:
        folder = getattr(paths, name.upper(), None)
        assert folder is None or folder == stage_folder(name), name


def test_each_stage_runs_its_own_module():
    for name, stage in read_dvc_stages(REPO).items():
        assert stage["cmd"] == f"python -m tasks.{name}"
        assert f"tasks/{name}.py" in stage["deps"]
