"""The layout rules of ARCHITECTURE.md, read from the source (every import, module-level or inside a
function): break one and a test names the file and the import."""
from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = {"tasks", "models", "serving", "flows"}
SHARED_TOP_LEVEL = {"tasks.config", "tasks.contract"}   # the two top-level modules of tasks/ that are not steps
SUBPACKAGES = {"core", "training", "variants", "ops", "monitoring", "blessing"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@cache
def imports_of(path: Path) -> tuple[str, ...]:
    """Every module `path` imports, resolved to its full dotted name (`from tasks import x` -> tasks.x)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [f"{node.module}.{alias.name}" if _is_module(f"{node.module}.{alias.name}") else node.module
                      for alias in node.names]
    return tuple(found)


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def step_modules() -> set[str]:
    """tasks/<name>.py at the top: one per stage or step (what `ls tasks` shows)."""
    return {f"tasks.{p.stem}" for p in (REPO / "tasks").glob("*.py") if p.stem != "__init__"} - SHARED_TOP_LEVEL


def violations(package: str, allowed) -> list[str]:
    """`file: import` for each project import of `package`'s files that `allowed(importer, imported)` refuses."""
    found = []
    for path in project_files(package):
        importer = module_name(path)
        for imported in imports_of(path):
            if imported.split(".")[0] in PROJECT_PACKAGES and not allowed(importer, imported):
                found.append(f"{path.relative_to(REPO)}: import {imported}")
    return found


def test_a_step_never_imports_another_step():
    steps = step_modules()
    assert {"tasks.prepare", "tasks.train", "tasks.bless", "tasks.canary"} <= steps

    def allowed(importer: str, imported: str) -> bool:
        return not any(imported == step or imported.startswith(step + ".") for step in steps - {importer})

    assert violations("tasks", allowed) == []


def test_shared_subpackages_never_import_steps_and_core_imports_nothing_above_it():
    steps = step_modules()

    def allowed(importer: str, imported: str) -> bool:
        if importer.split(".")[1] not in SUBPACKAGES and importer not in SHARED_TOP_LEVEL:
            return True
        if any(imported == step or imported.startswith(step + ".") for step in steps):
            return False
        if importer.startswith("tasks.core") or importer in SHARED_TOP_LEVEL:
            return imported.startswith("tasks.core") or imported in SHARED_TOP_LEVEL
        return True

    assert violations("tasks", allowed) == []


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


def test_serving_imports_only_models_config_contract_and_core():
    def allowed(importer: str, imported: str) -> bool:
        return (imported.split(".")[0] in {"models", "serving"} or imported in SHARED_TOP_LEVEL
                or imported == "tasks.core" or imported.startswith("tasks.core."))

    assert violations("serving", allowed) == []


@pytest.mark.parametrize("package", ["tasks", "models", "serving", "bench"])
def test_nothing_imports_flows(package):
    assert violations(package, lambda importer, imported: imported.split(".")[0] != "flows") == []


def closure(module: str) -> set[str]:
    """The project modules `module` runs, directly or through others (packages' __init__ included)."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen or not _is_module(name):
            continue
        seen.add(name)
        parts = name.split(".")
        # importing a.b.c runs a and a.b (an __init__ holding only a docstring runs nothing worth a dep)
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if not _docstring_only(".".join(parts[:i]))]
        base = REPO.joinpath(*parts)
        path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        todo += [m for m in imports_of(path) if m.split(".")[0] in PROJECT_PACKAGES]
    return seen


def _docstring_only(package: str) -> bool:
    body = ast.parse(REPO.joinpath(*package.split("."), "__init__.py").read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def test_every_dvc_stage_depends_on_all_the_code_it_runs():
    """A stage whose code changes must re-run: each project module a stage imports is a dvc.yaml dep
    (its file, or a folder above it)."""
    stages = YAML(typ="safe").load((REPO / "dvc.yaml").read_text())["stages"]
    uncovered = {}
    for name, stage in stages.items():
        deps = [d.rstrip("/") for d in stage.get("deps", []) if not d.startswith("data/")]
        for module in closure(f"tasks.{name}"):
            base = REPO.joinpath(*module.split("."))
            path = (base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py")
            relative = path.relative_to(REPO).as_posix()
            if not any(relative == dep or relative.startswith(dep + "/") for dep in deps):
                uncovered.setdefault(name, []).append(relative)
    assert uncovered == {}
