"""The layout rules of ARCHITECTURE.md, read from the source (every import, module-level or inside a
function, through tasks/stages/code_graph.py): break one and a test names the file and the import."""
from __future__ import annotations

import shutil
import sys

import pytest

from tasks.stages.code_deps import code_deps, stale_code_deps, write_code_deps
from tasks.stages.code_graph import REPO, import_cycles, imports_of, module_name, project_files, project_modules

PROJECT_PACKAGES = {"tasks", "models", "serving", "flows"}

# The layers, lowest first: a module may import its own layer and the ones below, never one above. A module
# belongs to the layer with the longest prefix that names it (tasks.core.errors is a spec, tasks.core.paths core).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("models", ("models",)),                                   # nn.Modules and their configs: torch only
    ("specs", ("tasks.core.errors", "tasks.core.contract_spec", "tasks.core.params_spec",
               "tasks.core.schema_spec", "tasks.modalities.image.contract")),   # typed specs and errors
    ("core", ("tasks.core", "tasks.modalities.image.decode", "tasks.modalities.image.sources",
              "tasks.modalities.image.shards")),                # on the specs
    ("loaders", ("tasks.config", "tasks.contract")),           # params.yaml and the data contract, loaded
    ("modalities", ("tasks.modalities",)),                     # one package per modality: read, check, serve...
    ("registry", ("tasks.registry",)),                         # the MLflow registry protocol, one package
    ("shared", ("tasks.training", "tasks.variants", "tasks.monitoring", "tasks.stages",
                "tasks.workspace", "tasks.sweep")),            # what several steps share, by concern
    ("steps", ("tasks",)),                                     # tasks/<step>.py or tasks/<step>/, one per step
    ("serving", ("serving",)),                                 # the service (narrower still: see below)
    ("flows", ("flows",)),                                     # Prefect flows, the CLI, the team-stack tool
)
SHARED_TOP_LEVEL = {"tasks.config", "tasks.contract"}   # the two top-level modules of tasks/ that are not steps
# The registry modules the service reads through: aliases and downloads, and the alias history it records hand moves in
SERVING_REGISTRY = ("tasks.registry.read", "tasks.registry.history", "tasks.registry.lock")


def layer_of(module: str) -> int:
    """The rank in LAYERS of the layer that holds `module`."""
    ranked = [(len(prefix), rank) for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
              if module == prefix or module.startswith(prefix + ".")]
    assert ranked, f"{module} is in no layer: add it to LAYERS"
    return max(ranked)[1]


def step_modules() -> set[str]:
    """tasks/<name>.py at the top, and tasks/<name>/ packages in no other layer (bless, canary): one per stage or
    step (what `ls tasks` shows)."""
    packages = {f"tasks.{p.parent.name}" for p in (REPO / "tasks").glob("*/__init__.py")}
    layered = {prefix for _, prefixes in LAYERS[:-3] for prefix in prefixes}
    return ({f"tasks.{p.stem}" for p in (REPO / "tasks").glob("*.py") if p.stem != "__init__"} - SHARED_TOP_LEVEL) | {
        package for package in packages if not any(package == p or package.startswith(p + ".") for p in layered)}


def violations(package: str, allowed) -> list[str]:
    """`file: import` for each project import of `package`'s files that `allowed(importer, imported)` refuses."""
    found = []
    for path in project_files(package):
        importer = module_name(path)
        for imported in imports_of(path):
            if imported.split(".")[0] in PROJECT_PACKAGES and not allowed(importer, imported):
                found.append(f"{path.relative_to(REPO)}: import {imported}")
    return found


def test_every_project_module_is_in_a_layer_and_the_layers_have_names():
    assert [name for name, _ in LAYERS][:6] == ["models", "specs", "core", "loaders", "modalities", "registry"]
    assert {layer_of(module) for module in project_modules()} == set(range(len(LAYERS)))
    assert LAYERS[layer_of("tasks.core.errors")][0] == "specs"
    assert LAYERS[layer_of("tasks.core.paths")][0] == "core"
    assert LAYERS[layer_of("tasks.train")][0] == "steps"


@pytest.mark.parametrize("package", sorted(PROJECT_PACKAGES))
def test_no_module_imports_a_layer_above_its_own(package):
    def allowed(importer: str, imported: str) -> bool:
        return layer_of(imported) <= layer_of(importer)

    assert violations(package, allowed) == []


def test_there_is_no_import_cycle_among_project_modules():
    """Function-level imports included: hiding an import inside a function hides a cycle, it does not break it."""
    assert import_cycles() == []


def test_a_step_never_imports_another_step():
    """In the source, never. One exception at run time, by design: the typed loader (tasks/config.py) imports the
    module of a step that declares its own params section (`PARAMS_SECTION` in tasks/<step>.py), when params.yaml
    holds that section and dvc.yaml names that step, to read its spec. So any stage's process may import such a
    module, to validate that section; it never calls it. The test below keeps that import the only one."""
    steps = step_modules()
    assert {"tasks.prepare", "tasks.train", "tasks.bless", "tasks.canary"} <= steps
    assert not steps & {"tasks.registry", "tasks.stages", "tasks.core"}

    def step_of(module: str) -> str | None:
        return next((step for step in steps if module == step or module.startswith(step + ".")), None)

    def allowed(importer: str, imported: str) -> bool:
        return step_of(imported) in (None, step_of(importer))

    assert violations("tasks", allowed) == []


def test_the_loader_is_the_only_code_that_imports_a_step_by_name():
    """`importlib.import_module` of a tasks/ module is the loader's alone (the models package imports its model
    files, and a user's own class, the same way)."""
    by_name = sorted(f"{path.relative_to(REPO)}" for package in ("tasks", "serving", "flows", "models")
                     for path in project_files(package) if "import_module(" in path.read_text())
    assert by_name == ["models/__init__.py", "tasks/config.py"]


def test_tasks_never_import_serving():
    """The service builds on tasks' shared code, never the other way round (batch scoring lives in serving/)."""
    assert violations("tasks", lambda importer, imported: not imported.startswith("serving")) == []


def test_models_import_torch_only():
    outside = []
    for path in project_files("models"):
        for imported in imports_of(path):
            top = imported.split(".")[0]
            if top not in sys.stdlib_module_names and top not in {"torch", "models", "__future__"}:
                outside.append(f"{path.relative_to(REPO)}: import {imported}")
    assert outside == []


def test_serving_imports_only_models_specs_core_loaders_modalities_and_the_registrys_read_side():
    def allowed(importer: str, imported: str) -> bool:
        return (imported.split(".")[0] == "serving" or imported in SERVING_REGISTRY
                or LAYERS[layer_of(imported)][0] in {"models", "specs", "core", "loaders", "modalities"})

    assert violations("serving", allowed) == []


STACK_TOOL = "flows.cli.stack"   # the team-stack tool behind `torchship stack`: the benchmarks start and time it


@pytest.mark.parametrize("package", ["tasks", "models", "serving", "bench"])
def test_nothing_imports_flows_but_the_benchmarks_of_the_team_stack_tool(package):
    def allowed(importer: str, imported: str) -> bool:
        return imported.split(".")[0] != "flows" or (package == "bench" and imported.startswith(STACK_TOOL + "."))

    assert violations(package, allowed) == []


def test_the_model_files_the_code_graph_finds_are_the_ones_the_registry_imports():
    """models/__init__.py finds its model files at run time; each stage's code deps must name the same files."""
    import models
    from tasks.stages.code_graph import discovered_modules

    assert set(discovered_modules("models")) == {model.__module__ for model in models.MODELS.values()}



def test_importing_the_models_package_imports_no_model_file_until_a_model_is_asked_for():
    """Every training step imports `models`; the model files (and what they import) load on the first lookup."""
    import subprocess

    code = ("import sys, models; loaded = lambda: sorted(m for m in sys.modules if m.startswith('models.')); "
            "print(loaded()); models.default_lr('mlp'); print(loaded())")
    shown = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    before, after = shown.stdout.splitlines()
    assert before == "[]" and "'models.tabular'" in after and "'models.cnn'" in after


def test_every_dvc_stage_lists_exactly_the_code_it_runs():
    """dvc.yaml's code deps are the import closure of each stage (`torchship dvc-deps` writes them): a missing
    file would leave the stage stale when that code changes, a superfluous one would re-run it for nothing."""
    assert stale_code_deps() == {}


def test_a_model_named_in_params_is_a_dep_of_the_stages_that_build_models(tmp_path):
    for folder in ("tasks", "models"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "models" / "mine.py").write_text("from torch import nn\n\n\nclass Net(nn.Module):\n    pass\n")
    (tmp_path / "params.yaml").write_text("train:\n  model: models.mine:Net\n")
    assert "models/mine.py" in code_deps("train", tmp_path)
    assert "models/mine.py" in code_deps("profile", tmp_path)
    assert "models/mine.py" not in code_deps("prepare", tmp_path)   # it never builds a model
    (tmp_path / "params.yaml").write_text("train:\n  model: mlp\n")
    assert "models/mine.py" not in code_deps("train", tmp_path)


def test_the_deps_writer_fixes_a_missing_and_a_superfluous_dep_and_keeps_comments_and_data(tmp_path):
    for entry in ("tasks", "models", "params.yaml", "dvc.yaml"):
        copy = shutil.copytree if (REPO / entry).is_dir() else shutil.copy
        copy(REPO / entry, tmp_path / entry)
    current = (REPO / "dvc.yaml").read_text()
    broken = current.replace("      - tasks/core/sources.py\n", "", 1).replace(
        "      - tasks/baseline.py\n", "      - tasks/baseline.py\n      - tasks/core/servelog.py\n", 1)
    (tmp_path / "dvc.yaml").write_text(broken)
    assert stale_code_deps(tmp_path) == {
        "source": {"missing": ["tasks/core/sources.py"], "superfluous": []},
        "baseline": {"missing": [], "superfluous": ["tasks/core/servelog.py"]}}
    assert write_code_deps(tmp_path) == ["source", "baseline"]
    assert (tmp_path / "dvc.yaml").read_text() == current     # comments, data and params deps as they were
    assert stale_code_deps(tmp_path) == {}


def test_no_two_test_modules_share_a_name():
    """The test folders are not packages: two modules with one name make collection fail ('import file mismatch')
    whenever both are collected in one process, which `make test-fast` or a single-folder run does not show."""
    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: found for name, found in names.items() if len(found) > 1} == {}


def top_level_names(path) -> tuple[set[str], set[str]]:
    """(names `path` defines at its top level, names it imports there)."""
    import ast

    defined, imported = set(), set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return defined, imported


def code_of(path) -> list:
    """The module's syntax tree, and the tree of each string in it that is Python code with an import (a child
    process's script, `python -c`): those import as the module does."""
    import ast
    import textwrap

    tree = ast.parse(path.read_text())
    scripts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            for line in textwrap.dedent(node.value).splitlines():   # a piece of an f-string is no whole script
                if line.lstrip().startswith(("from ", "import ")):
                    try:
                        scripts.append(ast.parse(line.strip()))
                    except SyntaxError:
                        continue
    return [tree, *scripts]


def test_each_name_has_one_import_path():
    """No module imports a name from a module that only imported it (a re-export, a façade, a shim): a name is
    imported from where it is defined, so reading an import tells where to look. The scripts tests and benchmarks
    hand to child processes count too (where a name that moved would fail only when the child runs)."""
    import ast

    from tasks.stages.code_graph import module_path

    through = []
    for package in (*sorted(PROJECT_PACKAGES), "tests", "bench"):
        for path in project_files(package):
            for node in (node for tree in code_of(path) for node in ast.walk(tree)):
                if not (isinstance(node, ast.ImportFrom) and node.module and not node.level
                        and (source := module_path(node.module))):
                    continue
                defined, imported = top_level_names(source)
                through += [f"{path.relative_to(REPO)}: from {node.module} import {alias.name}"
                            for alias in node.names if alias.name not in defined
                            and not module_path(f"{node.module}.{alias.name}")]
    assert through == []
