"""Security defaults: nothing in the code unpickles or loads YAML/torch files unsafely or evaluates data; Prefect
results are JSON; every server binds loopback unless configured; the rendezvous defaults to loopback; admin
endpoints compare their token in constant time (403/401: tests/integration/test_service_inprocess.py)."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from tests.conftest import REPO

SCANNED = ("tasks", "flows", "serving", "models", "bench")
UNPICKLERS = {("pickle", "load"), ("pickle", "loads"), ("cloudpickle", "load"), ("cloudpickle", "loads"),
              ("dill", "load"), ("dill", "loads"), ("joblib", "load"), ("pd", "read_pickle"), ("pandas", "read_pickle"),
              ("yaml", "unsafe_load"), ("yaml", "full_load"), ("yaml", "unsafe_load_all"), ("marshal", "loads")}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader"}


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is(node, value) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def unsafe_calls(source: str, pyyaml: bool) -> list[str]:
    """What in `source` can run code hidden in data: unpickling, torch.load without weights_only=True, PyYAML
    load without a safe loader, ruamel's unsafe loader, numpy's allow_pickle, eval/exec."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func, line = node.func, f"line {node.lineno}"
        if isinstance(func, ast.Name) and func.id in {"eval", "exec"}:
            found.append(f"{line}: {func.id}()")
        if not isinstance(func, ast.Attribute):
            if isinstance(func, ast.Name) and func.id == "YAML" and _keyword(node, "typ") is not None \
                    and any(_is(_keyword(node, "typ"), t) for t in ("unsafe", "full")):
                found.append(f"{line}: ruamel YAML(typ=unsafe)")
            continue
        owner = func.value.id if isinstance(func.value, ast.Name) else getattr(func.value, "attr", "")
        if (owner, func.attr) in UNPICKLERS:
            found.append(f"{line}: {owner}.{func.attr}()")
        elif (owner, func.attr) == ("torch", "load") and not _is(_keyword(node, "weights_only"), True):
            found.append(f"{line}: torch.load() without weights_only=True")
        elif pyyaml and owner == "yaml" and func.attr in {"load", "load_all"}:
            loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            if getattr(loader, "attr", getattr(loader, "id", None)) not in SAFE_YAML_LOADERS:
                found.append(f"{line}: yaml.{func.attr}() without a safe Loader")
        elif (owner, func.attr) == ("np", "load") and _is(_keyword(node, "allow_pickle"), True):
            found.append(f"{line}: np.load(allow_pickle=True)")
    return found


def _uses_pyyaml(source: str) -> bool:
    """`yaml` is PyYAML here (not a ruamel YAML() instance, whose default round-trip loader builds no objects)."""
    tree = ast.parse(source)
    return any(isinstance(n, ast.Import) and any(a.name == "yaml" for a in n.names) for n in ast.walk(tree))


def test_the_scanner_finds_each_unsafe_call():
    planted = ("import pickle, torch, yaml\nimport numpy as np\npickle.loads(b)\ntorch.load(p)\n"
               "torch.load(p, weights_only=False)\nyaml.load(t)\nyaml.unsafe_load(t)\nnp.load(p, allow_pickle=True)\n"
               "eval(text)\nexec(text)\nYAML(typ='unsafe')\n")
    assert len(unsafe_calls(planted, pyyaml=True)) == 9
    safe = ("torch.load(p, weights_only=True)\nyaml.load(t, Loader=yaml.SafeLoader)\nyaml.safe_load(t)\n"
            "model.eval()\nYAML(typ='safe').load(t)\nnp.load(p)\n")
    assert unsafe_calls(safe, pyyaml=True) == []


def test_no_unsafe_loading_or_eval_anywhere_in_the_code():
    files = [p for folder in SCANNED for p in sorted((REPO / folder).rglob("*.py"))]
    assert len(files) > 50
    found = {}
    for path in files:
        source = path.read_text()
        if hits := unsafe_calls(source, _uses_pyyaml(source)):
            found[str(path.relative_to(REPO))] = hits
    assert found == {}


def test_prefect_results_are_serialized_as_json(tmp_path, monkeypatch):
    """Where Prefect persists a result (a failed run's exception, a cached task), it is JSON, never a pickle."""
    from flows.environment import configure_environment

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")})
    configure_environment(tmp_path)             # what every command does on entering the project
    from prefect.settings import Settings

    # the settings a fresh command reads (this process's own may be fixed already: another test used Prefect)
    assert Settings().results.default_serializer == "json"


# A raw pickle, or Prefect's result record (compact JSON) naming a pickle serializer or holding a base64 pickle.
PICKLED = re.compile(rb'\A\x80|"type":\s*"(compressed/)?pickle"|"gA[SW]V')
PERSIST_A_RESULT = """
from flows.environment import enter_project
enter_project()                              # what every torchship command does first
from prefect import flow, task

@task(persist_result=True)
def scored() -> dict:
    return {"rows": 3}

@flow
def persisted() -> dict:
    return scored()

persisted()
"""


def test_pickled_prefect_results_are_not_left_in_the_pipeline_run(tiny_pipeline):
    """Where the pipeline's project keeps Prefect results, nothing is a pickle. A successful run persists no
    result, so a task result is persisted there on purpose (as a cached task would be): the folder is not empty."""
    project, _ = tiny_pipeline
    project.python(PERSIST_A_RESULT, env=project.env())
    storage = project.root / ".prefect" / "storage"
    stored = [path.read_bytes() for path in storage.rglob("*") if path.is_file()]
    assert stored, f"no result was persisted in {storage}"
    pickled = [data[:200] for data in stored if PICKLED.search(data)]
    assert pickled == []


def test_every_server_binds_loopback_unless_configured(tmp_path):
    from serving.__main__ import parse_args, serve_params
    from tasks.config import default_params
    from tasks.core.params_spec import TrackingParams
    from tasks.workspace.ui import ui_servers

    params = default_params()
    assert serve_params(params.serve, parse_args(params, ["--model-name", "m"])).host == "127.0.0.1"
    for server in ui_servers(TrackingParams(), 5000, 4200, environ={}):   # the embedded default
        assert server.command[server.command.index("--host") + 1] == "127.0.0.1", server.name
    source = (REPO / "tasks" / "core" / "procs.py").read_text()
    assert '"--host", "127.0.0.1"' in source        # the bless/canary/demo service


def test_the_rendezvous_defaults_to_loopback():
    from tasks.core.params_spec import TrainParams
    from tasks.training.distributed import torchrun_command

    assert TrainParams().rdzv_endpoint.split(":")[0] == "127.0.0.1"
    assert "--standalone" in torchrun_command(TrainParams())     # one node: a local store, no endpoint to expose
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "rendezvous has no authentication" in readme


def calls_in(path: Path, function: str) -> tuple[ast.FunctionDef, set[str]]:
    """`function`'s definition in `path`, and the names it calls."""
    tree = ast.parse(path.read_text())
    found = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return found, {getattr(n.func, "attr", getattr(n.func, "id", "")) for n in ast.walk(found)
                   if isinstance(n, ast.Call)}


def test_admin_token_is_compared_in_constant_time():
    assert "token_refusal" in calls_in(REPO / "serving" / "app.py", "require_admin")[1]   # the one check
    admin, calls = calls_in(REPO / "serving" / "front.py", "token_refusal")
    assert "compare_digest" in calls
    compares = [n for n in ast.walk(admin) if isinstance(n, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq))
                                                                                  for o in n.ops)]
    assert compares == []                      # no `given == expected` beside it
