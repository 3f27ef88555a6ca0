"""Every collective goes through tasks/training/collectives.py, which puts its tensor on the process group's device:
nccl refuses a CPU tensor ("No backend type associated with device type cpu"), and a train stage on a GPU used to
fail so after its last epoch (job.py all-reduced a CPU tensor).

A CPU machine cannot put data on a GPU, so the call-site test runs the real call sites, on two ranks, in a real gloo
group bound to the meta device ("meta:gloo"): gloo then refuses a CPU tensor with exactly nccl's message and
accepts a tensor on the group's device. A meta tensor carries no data, so each call site is stopped right after its
collective accepted the tensor (tests/helpers/collective_sites.py); the values the same call sites return are then
checked in a plain CPU gloo group. A call site that makes its tensor where it likes (on the CPU, beside its data)
fails the first half the way it fails under nccl on a GPU."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from tasks.stages.code_graph import REPO, project_files

THE_ONE_PLACE = REPO / "tasks" / "training" / "collectives.py"
# The torch.distributed functions that talk to the other ranks.
COLLECTIVES = frozenset({
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "gather", "gather_object", "irecv",
    "isend", "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send"})
WORLD = 2


def distributed_aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the torch.distributed module, collectives imported by name from it) in one file."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and node.level == 0:
            modules |= {a.asname or a.name for a in node.names if a.name == "distributed"}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            functions |= {a.asname or a.name for a in node.names if a.name in COLLECTIVES}
    return modules, functions


def collective_calls(path, root=REPO) -> list[str]:
    """`file:line name` (relative to `root`) for each call of a torch.distributed collective in `path`."""
    tree = ast.parse(path.read_text())
    modules, functions = distributed_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        named = isinstance(target, ast.Name) and target.id in functions
        if isinstance(target, ast.Attribute) and target.attr in COLLECTIVES:
            owner = target.value
            named = (isinstance(owner, ast.Name) and owner.id in modules) or (
                isinstance(owner, ast.Attribute) and owner.attr == "distributed"
                and isinstance(owner.value, ast.Name) and owner.value.id == "torch")
        if named:
            found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(target)}")
    return found


def test_only_the_one_place_calls_a_collective():
    calls = {path: collective_calls(path) for package in ("tasks", "models", "serving", "flows")
             for path in project_files(package)}
    assert calls[THE_ONE_PLACE], "the scan finds nothing where collectives are called: it is broken"
    assert [call for path, found in calls.items() if path != THE_ONE_PLACE for call in found] == []


def test_the_scan_sees_each_way_of_naming_a_collective(tmp_path):
    source = tmp_path / "tasks" / "x.py"
    source.parent.mkdir()
    source.write_text("import torch\nimport torch.distributed as d\nfrom torch import distributed\n"
                      "from torch.distributed import broadcast as cast\n"
                      "d.all_reduce(t)\ntorch.distributed.barrier()\ndistributed.all_gather(a, t)\ncast(t, 0)\n"
                      "d.get_rank()\n")
    assert [call.split(" ")[1] for call in collective_calls(source, tmp_path)] == [
        "d.all_reduce", "torch.distributed.barrier", "distributed.all_gather", "cast"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Both ranks' records from tests/helpers/collective_sites.py."""
    folder = tmp_path_factory.mktemp("collectives")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    children = [subprocess.Popen([sys.executable, "-m", "tests.helpers.collective_sites", str(rank), str(WORLD),
                                  str(folder)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for rank in range(WORLD)]
    outputs = [child.communicate(timeout=180)[0] for child in children]
    for child, output in zip(children, outputs):
        assert child.returncode == 0, output[-3000:]
    return [json.loads((folder / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]


def test_every_call_site_puts_its_tensor_on_the_group_s_device(ranks):
    """Under a group that refuses CPU tensors as nccl does, each collective accepted what its call site sent."""
    outcomes = {f"rank {rank} {site}": found for rank, record in enumerate(ranks)
                for site, found in record["refusing"].items()}
    assert len(outcomes) == 3 * WORLD
    misplaced = {where: found for where, found in outcomes.items() if "on meta" not in found.get("reached", "")}
    assert not misplaced, "\n".join(f"{where}: {found}" for where, found in misplaced.items())


def test_the_call_sites_return_the_reduced_and_broadcast_values(ranks):
    values = [record["values"] for record in ranks]
    assert all("returned" in found for record in values for found in record.values()), values
    summed = [record["job.summed_peak_rss_mb"]["returned"] for record in values]
    low, high = (sum(record["own_peak_rss_mb"][i] for record in ranks) for i in (0, 1))
    assert summed[0] == summed[1] and low <= summed[0] <= high
    losses = [record["loop.Trainer.train loss sum"]["returned"] for record in values]
    assert losses[0] == losses[1] > 0   # each rank trained its own shard; the reduced loss is the same on both
    assert [record["distributed.broadcast_state"]["returned"] for record in values] == [
        {"weights": [[0.0, 1.5, 3.0], [4.5, 6.0, 7.5]], "step": 7}] * WORLD
