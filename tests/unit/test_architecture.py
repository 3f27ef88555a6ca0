"""The layout rules of ARCHITECTURE.md, read from the source (every import, module-level or inside a
function, through tasks/stages/code_graph.py): break one and a test names the file and the import."""
from __future__ import annotations

import re
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
    ("specs", ("tasks.core.errors", "tasks.core.params_spec", "tasks.core.schema_spec")),   # typed specs, errors
    ("core", ("tasks.core",)),                                 # on the specs: what every modality and step uses
    ("modalities", ("tasks.modalities",)),                     # one package per modality, behind one interface
    ("loaders", ("tasks.config",)),                            # params.yaml, with each modality's own section
    ("registry", ("tasks.registry",)),                         # the MLflow registry protocol, one package
    ("shared", ("tasks.training", "tasks.variants", "tasks.monitoring", "tasks.stages",
                "tasks.workspace", "tasks.sweep")),            # what several steps share, by concern
    ("steps", ("tasks",)),                                     # tasks/<step>.py or tasks/<step>/, one per step
    ("serving", ("serving",)),                                 # the service (narrower still: see below)
    ("flows", ("flows",)),                                     # Prefect flows, the CLI, the team-stack tool
)
SHARED_TOP_LEVEL = {"tasks.config"}   # the top-level module of tasks/ that is no step
# The registry modules the service reads through: aliases and downloads, and the alias history it records hand moves in
SERVING_PART = re.compile(r"tasks\.modalities\.\w+\.serving")   # a modality's request decoding, all the service takes
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
    assert [name for name, _ in LAYERS][:6] == ["models", "specs", "core", "modalities", "loaders", "registry"]
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
    """Nor at run time: nothing imports a step by name (the test below)."""
    steps = step_modules()
    assert {"tasks.prepare", "tasks.train", "tasks.bless", "tasks.canary"} <= steps
    assert not steps & {"tasks.registry", "tasks.stages", "tasks.core"}

    def step_of(module: str) -> str | None:
        return next((step for step in steps if module == step or module.startswith(step + ".")), None)

    def allowed(importer: str, imported: str) -> bool:
        return step_of(imported) in (None, step_of(importer))

    assert violations("tasks", allowed) == []


def test_only_the_two_registries_import_by_name():
    """`importlib.import_module` finds the model files (and a user's own class) and the modality packages (and their
    serving parts), and nothing else: no step is imported by name."""
    by_name = sorted(f"{path.relative_to(REPO)}" for package in ("tasks", "serving", "flows", "models")
                     for path in project_files(package) if "import_module(" in path.read_text())
    assert by_name == ["models/__init__.py", "tasks/modalities/__init__.py"]


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


def test_serving_imports_only_models_specs_core_loaders_each_modalitys_serving_part_and_the_registrys_read_side():
    """Of the modalities, the service imports the seam (`tasks.modalities`: which modality a version holds) and each
    one's serving part (`tasks/modalities/<name>/serving.py`), never the rest of a modality package."""
    def allowed(importer: str, imported: str) -> bool:
        return (imported.split(".")[0] == "serving" or imported in SERVING_REGISTRY or imported == "tasks.modalities"
                or SERVING_PART.fullmatch(imported) is not None
                or LAYERS[layer_of(imported)][0] in {"models", "specs", "core", "loaders"})

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
    broken = current.replace("      - tasks/modalities/table/sources.py\n", "", 1).replace(
        "      - tasks/baseline.py\n", "      - tasks/baseline.py\n      - tasks/workspace/ui.py\n", 1)
    (tmp_path / "dvc.yaml").write_text(broken)
    assert stale_code_deps(tmp_path) == {
        "source": {"missing": ["tasks/modalities/table/sources.py"], "superfluous": []},
        "baseline": {"missing": [], "superfluous": ["tasks/workspace/ui.py"]}}
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


# Where code outside a modality package may name a modality, and why (at most five: each is a declaration or a word
# that is no modality, never a branch).
NAMING_ALLOWED = {
    ("tasks/registry/model_card.py", "names modality 'table'"): "markdown-it's table extension, not the modality",
}


def modality_naming(path) -> list[str]:
    """What `path` says about modalities that only a modality package may say: a modality's name as a string (a model
    file's `modality = "<name>"` declaration and a dict key or subscript, a field's name, aside), an `is_<modality>`
    predicate, or a modality package's type in an `isinstance` or a union."""
    import ast

    from tasks.modalities import registered_modalities

    names = set(registered_modalities())
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    declared = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["modality"]}
    keys = {id(key) for node in ast.walk(tree) if isinstance(node, ast.Dict) for key in node.keys} | {
        id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}   # a field's name, no branch
    types = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module and node.module.startswith("tasks.modalities.") and node.module.split(".")[2] in names
             for alias in node.names}
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings | declared | keys):
            found.add(f"names modality {node.value!r}")
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if name.startswith("is_") and name[3:].split("_")[0].rstrip("s") in names:
            found.add(f"predicate {name}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            found |= {f"isinstance of {n.id}" for n in ast.walk(node.args[1])
                      if isinstance(n, ast.Name) and n.id in types}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            found |= {f"union with {n.id}" for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in types}
    return sorted(found)


def test_no_code_outside_a_modality_package_asks_which_modality_it_has():
    """The steps, the shared engine, the seam, the service, the flows and the models never branch on a modality:
    each modality is one package behind one interface (tasks/modalities/), found at run time."""
    from tasks.modalities import package_names

    asking = []
    for package in ("tasks", "serving", "flows", "models"):
        for path in project_files(package):
            relative = path.relative_to(REPO).as_posix()
            if any(relative.startswith(f"tasks/modalities/{name}/") for name in package_names()):
                continue
            asking += [f"{relative}: {what}" for what in modality_naming(path)
                       if (relative, what) not in NAMING_ALLOWED]
    assert asking == []
    assert len(NAMING_ALLOWED) <= 5


def test_the_modality_check_finds_each_way_of_asking(tmp_path):
    """The check above can fail: each way of branching on a modality is found."""
    sample = tmp_path / "step.py"
    sample.write_text(
        "from tasks.modalities.image.serving import ImageRows\n"
        "from tasks.modalities.table.serving import Rows\n\n\n"
        "def run(schema, rows: Rows | ImageRows):\n"
        "    if schema.is_image or schema.modality == 'image':\n"
        "        return isinstance(rows, ImageRows)\n")
    assert modality_naming(sample) == ["isinstance of ImageRows", "names modality 'image'", "predicate is_image",
                                       "union with ImageRows", "union with Rows"]
