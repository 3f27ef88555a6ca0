"""Each DVC stage's code deps, derived rather than typed: the files of every project module the stage runs (the
import closure of tasks/<stage>.py, tasks/stages/code_graph.py), plus the file of a model loaded by name
(`train.model: package.module:Class`) and the package of the configured modality (found at run time by the seam,
tasks/modalities/, so a table project's stages depend on the table package's code and not on the image package's).
`torchship dvc-deps` writes them into dvc.yaml, keeping its comments and its data and params deps;
tests/unit/test_architecture.py fails when they are not current. So a change re-runs
exactly the stages whose code changed: editing the request-log format re-runs none."""
from __future__ import annotations

from pathlib import Path

from tasks.config import PARAMS_FILE, load_params, read_params_file
from tasks.core.dvc_file import DVC_FILE
from tasks.stages.code_graph import REPO, closure, module_path
from tasks.stages.stage_list import read_dvc_stages

DATA_FOLDER = "data/"   # deps under it are what stages write, not code


def named_model_module(params_file: Path) -> str | None:
    """The module of `train.model` when it names one (`package.module:Class`), else None (a built-in model,
    whose file the models package imports anyway)."""
    model = str((read_params_file(params_file).get("train") or {}).get("model") or "")
    return model.partition(":")[0] if ":" in model else None


def configured_modality(root: Path) -> str:
    """The package of the modality params.yaml under `root` configures (`data.modality`, or by `auto` the one the
    source's kind calls for, a relative source read from `root`)."""
    from tasks.modalities import detect_modality, package_of

    params = load_params(root / PARAMS_FILE)
    source = root / params.data.source
    data = params.data.model_copy(update={"source": str(source)}) if source.exists() else params.data
    return package_of(detect_modality(data, params).name)


def code_deps(stage: str, root: Path = REPO) -> list[str]:
    """The repository files stage `stage` runs, sorted."""
    modules = closure(f"tasks.{stage}", root)
    named = named_model_module(root / PARAMS_FILE)
    if named and "models" in modules:   # a stage that builds models (models.build_model) imports this one by name
        modules |= closure(named, root)
    if "tasks.modalities" in modules:   # a stage behind the seam runs the configured modality's package...
        modality = closure(f"tasks.modalities.{configured_modality(root)}", root)
        builds_models = "models" in modules   # ...and its models only where the stage itself builds models
        modules |= {m for m in modality if builds_models or not (m == "models" or m.startswith("models."))}
    return sorted(module_path(module, root).relative_to(root).as_posix() for module in modules)


def is_code_dep(dep: str) -> bool:
    return not dep.startswith(DATA_FOLDER)


def stale_code_deps(root: Path = REPO) -> dict[str, dict[str, list[str]]]:
    """{stage: {"missing": [...], "superfluous": [...]}} for each stage whose code deps in dvc.yaml differ from
    the derived ones; {} when dvc.yaml is current."""
    stale = {}
    for name, stage in read_dvc_stages(root).items():
        listed = {dep for dep in stage.get("deps", []) if is_code_dep(dep)}
        derived = set(code_deps(name, root))
        if listed != derived:
            stale[name] = {"missing": sorted(derived - listed), "superfluous": sorted(listed - derived)}
    return stale


def write_code_deps(root: Path = REPO) -> list[str]:
    """Rewrite each stage's code deps in dvc.yaml as derived (first, sorted; data deps after, with their
    comments); returns the stages that changed."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    path = root / DVC_FILE
    document = yaml.load(path.read_text())
    changed = []
    for name, stage in document["stages"].items():
        deps = stage["deps"]
        derived = code_deps(name, root)
        data = [(dep, deps.ca.items.get(index)) for index, dep in enumerate(deps) if not is_code_dep(dep)]
        if [dep for dep in deps if is_code_dep(dep)] == derived:
            continue
        del deps[:]
        deps.ca.items.clear()
        deps.extend(derived + [dep for dep, _ in data])
        for offset, (_, comment) in enumerate(data):
            if comment:
                deps.ca.items[len(derived) + offset] = comment
        changed.append(name)
    if changed:
        with path.open("w") as handle:
            yaml.dump(document, handle)
    return changed
