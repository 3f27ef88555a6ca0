"""The project's import graph, read from the source (every import, module-level or inside a function): what each
module imports, and the closure of modules a stage runs. tests/unit/test_architecture.py checks the layers with
it; tasks/stages/code_deps.py derives each DVC stage's code deps from it."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("tasks", "models", "serving", "flows")


def module_name(path: Path, root: Path = REPO) -> str:
    """tasks/core/paths.py -> tasks.core.paths; a package's __init__.py -> the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str, root: Path = REPO) -> Path | None:
    """The file that defines module `name`, None when it is no project module (a class or function name)."""
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return base / "__init__.py" if (base / "__init__.py").exists() else None


def project_files(package: str, root: Path = REPO) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def project_modules(root: Path = REPO) -> list[str]:
    return [module_name(path, root) for package in PROJECT_PACKAGES for path in project_files(package, root)]


@cache
def _parsed_imports(path: Path, root: Path) -> tuple[str, ...]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from tasks.core import paths` imports the module tasks.core.paths; `from tasks.config import Params`
            # imports tasks.config
            found += [f"{node.module}.{alias.name}" if module_path(f"{node.module}.{alias.name}", root)
                      else node.module for alias in node.names]
    return tuple(found)


def imports_of(path: Path, root: Path = REPO) -> tuple[str, ...]:
    """Every module `path` imports, resolved to its full dotted name (`from tasks import x` -> tasks.x)."""
    return _parsed_imports(path.resolve(), root.resolve())


@cache
def _run_by_name(path: Path) -> tuple[str, ...]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
            found += [module for flag, module in zip(items, items[1:]) if flag == "-m" and isinstance(module, str)]
    return tuple(found)


def modules_run_by_name(path: Path) -> tuple[str, ...]:
    """The modules a file starts as `python -m <module>` (an argument list holding "-m", "<module>"): code that
    runs without being imported, e.g. the torchrun launcher."""
    return _run_by_name(path.resolve())


def project_imports(module: str, root: Path = REPO) -> set[str]:
    """The project modules `module` imports directly."""
    path = module_path(module, root)
    return {name for name in imports_of(path, root)
            if name.split(".")[0] in PROJECT_PACKAGES and module_path(name, root)} if path else set()


def closure(module: str, root: Path = REPO) -> set[str]:
    """The project modules `module` runs, directly or through others: what they import, what they start as
    `python -m`, and packages' __init__ (except one that holds only a docstring: it runs nothing worth a dep)."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen or module_path(name, root) is None:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if not _docstring_only(".".join(parts[:i]), root)]
        # `-m serving` (tasks/core/procs.py's running_service) starts the service only in Prefect-only steps
        # (bless, canary): followed, it would make every stage that imports procs depend on all of serving/
        todo += sorted(project_imports(name, root)) + [run for run in modules_run_by_name(module_path(name, root))
                                                      if run.startswith("tasks.")]
        todo += discovered_modules(name, root)
    return seen


REGISTERS = re.compile(r"^MODELS\b", re.M)   # models/__init__.py's mark of a model file (it imports only those)


def discovered_modules(package: str, root: Path = REPO) -> list[str]:
    """The modules a package's __init__ imports by finding them (`pkgutil.iter_modules(__path__)`, as models/ finds
    its model files): those that carry the mark at their top level."""
    init = root.joinpath(*package.split("."), "__init__.py")
    if not init.exists() or "iter_modules(__path__)" not in init.read_text():
        return []
    return [f"{package}.{path.stem}" for path in sorted(init.parent.glob("*.py"))
            if path.stem != "__init__" and REGISTERS.search(path.read_text())]


def _docstring_only(package: str, root: Path) -> bool:
    body = ast.parse(root.joinpath(*package.split("."), "__init__.py").read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def import_cycles(root: Path = REPO) -> list[list[str]]:
    """Every group of project modules that import each other, directly or round a loop (Tarjan's strongly
    connected components of more than one module, or a module importing itself)."""
    graph = {name: project_imports(name, root) for name in project_modules(root)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in sorted(graph.get(name, ())):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            group = []
            while not group or group[-1] != name:
                group.append(stack.pop())
            if len(group) > 1 or name in graph.get(name, ()):
                cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles
