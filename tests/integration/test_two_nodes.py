"""Two-node training over a real link: the train stage (`python -m tasks.train`, which builds and runs torchrun)
on two network namespaces joined by a veth pair, each node in a folder of its own, meeting by c10d rendezvous on
node 0's veth address. Each namespace has only `lo` and its veth end, so everything the nodes say to each other
(the rendezvous, the workers' store, gloo's all-reduces) crosses the veth.

- A two-node run gives the weights of one node with two processes: same seed, same global batch, same shards, and
  an all-reduce of two gradients is one addition, which is commutative, so they are expected bit-identical; the
  test allows WEIGHT_TOLERANCE for a reduction order that could differ (measured here: 0).
  The two-node run is the one below whose worker is killed and restarted: equality there shows both that the link
  changes nothing and that the resume is exact.
- `train.max_restarts: 1`: node 1's worker, SIGKILLed mid-run, is restarted by torchrun and resumes from the step-25
  checkpoint that rank 0 wrote on node 0 (rank 0 sends it over the link: node 1 has no copy of node 0's disk).
- `train.max_restarts: 0`: node 1 dies whole (every process in its namespace SIGKILLed); node 0 fails within
  LOST_NODE_BOUND_S and its error names node 1's address.

Namespaces and veth ends carry PREFIX and this process id; they are removed on every exit (the fixture's finally,
and atexit), and leftovers of processes that no longer run are removed before new ones are made.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tasks.core.env import FAULT_ENV, LOCAL_RANK_ENV, NODE_INTERFACE_ENVS
from tests.conftest import BIN, make_project

pytestmark = pytest.mark.integration
PREFIX = "tsnode"
WEIGHT_TOLERANCE = 1e-6     # max abs difference of any weight, two nodes vs one node of two processes
CHECKPOINT_STEP = 25        # train.checkpoint_every: the step the killed runs resume from
FAULT = f"hang:1:{CHECKPOINT_STEP + 5}"   # rank 1 stops answering after that checkpoint, so the kill comes after it
COLLECTIVE_TIMEOUT_S = 10   # the schema's minimum
# A killed node's sockets are reset by its kernel, so the survivor's next collective fails at once; had the link
# gone silent instead, train.collective_timeout_s would end it. Then torchrun stops and reports: allow 20 s for that.
LOST_NODE_BOUND_S = COLLECTIVE_TIMEOUT_S + 20
TRAIN = {"model": "mlp", "model_args": {"mlp": {"hidden": [16], "embedding_dim": 4}}, "epochs": 2, "batch_size": 64,
         "adapt": False, "nproc": 2, "nnodes": 1, "threads": 1, "checkpoint_every": CHECKPOINT_STEP,
         "collective_timeout_s": COLLECTIVE_TIMEOUT_S, "cv_max_rows": 0}   # one network, not cross-validated members


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def processes_in(namespace: str) -> list[int]:
    return [int(pid) for pid in ip("netns", "pids", namespace).stdout.split()]


def stop_processes(namespace: str) -> None:
    """SIGKILL whatever runs in the namespace: only this test starts anything there."""
    for pid in processes_in(namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_namespace(name: str) -> None:
    """Stop what runs in it, then delete it; the veth end inside goes with it, and its peer with that."""
    stop_processes(name)
    ip("netns", "delete", name)


def remove_leftovers() -> None:
    """Delete namespaces named PREFIX-<pid>-... whose creating process no longer runs."""
    for name in [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]:
        parts = name.split("-")
        if parts[0] == PREFIX and len(parts) > 2 and parts[1].isdigit() and not Path(f"/proc/{parts[1]}").exists():
            remove_namespace(name)


@dataclass(frozen=True)
class Link:
    namespaces: tuple[str, str]
    addresses: tuple[str, str]   # node 0's and node 1's, on a private /30 that exists only inside the two
    interfaces: tuple[str, str]


def make_link(tag: str) -> Link:
    """Two namespaces with `lo` up, joined by a veth pair created inside them (never in this machine's own)."""
    namespaces = (f"{PREFIX}-{os.getpid()}-{tag}-0", f"{PREFIX}-{os.getpid()}-{tag}-1")
    interfaces = (f"{PREFIX}{tag}a", f"{PREFIX}{tag}b")   # <= 15 characters, as Linux requires
    # torchrun ranks the nodes by their addresses as text: node 0's must sort first for rank 0 (and the
    # checkpoints, and the model) to be on node 0, as the test reads them there.
    network = f"10.{random.randrange(256)}.{random.randrange(256)}"
    addresses = (f"{network}.1", f"{network}.2")
    steps = [("netns", "add", namespaces[0]), ("netns", "add", namespaces[1]),
             ("link", "add", interfaces[0], "netns", namespaces[0], "type", "veth",
              "peer", "name", interfaces[1], "netns", namespaces[1])]
    for namespace, interface, address in zip(namespaces, interfaces, addresses):
        steps += [("-n", namespace, "link", "set", "lo", "up"),
                  ("-n", namespace, "addr", "add", f"{address}/30", "dev", interface),
                  ("-n", namespace, "link", "set", interface, "up")]
    for step in steps:
        done = ip(*step)
        if done.returncode != 0:
            raise OSError(f"ip {' '.join(step)}: {done.stderr.strip()}")
    return Link(namespaces, addresses, interfaces)


@pytest.fixture(scope="module")
def link():
    """The two nodes' network, or a skip with the reason (a failure under CI=true) where namespaces cannot be made."""
    remove_leftovers()
    tag = secrets.token_hex(3)
    mine = [f"{PREFIX}-{os.getpid()}-{tag}-{i}" for i in (0, 1)]
    cleanup = lambda: [remove_namespace(name) for name in mine]   # noqa: E731
    atexit.register(cleanup)
    try:
        try:
            made = make_link(tag)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"cannot make network namespaces here (needs root and `ip netns`): {exc}"
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
        yield made
    finally:
        cleanup()
        atexit.unregister(cleanup)


def set_train(root: Path, **train) -> None:
    """Write train.* into the node's params.yaml, validated, as `torchship run --set` would."""
    from tasks.config import parse_params, read_params_file
    from tasks.stages.overrides import merge, write_params

    raw = merge(read_params_file(root / "params.yaml"), {"train": train})
    parse_params(raw, origin=str(root / "params.yaml"))
    write_params(raw, str(root / "params.yaml"))


def prepare_in_place(root: Path) -> None:
    """The prepare stage's splits and schema, written in-process (the stage adds only its MLflow run)."""
    from tasks.config import load_params
    from tasks.modalities.sources import resolve_target
    from tasks.modalities.table.prepare import prepare_tables, write_prepared
    from tasks.modalities.table.sources import read_source

    with contextlib.chdir(root):
        params = load_params()
        raw, origin, found = read_source(params.data)
        write_prepared(prepare_tables(raw, resolve_target(params), origin, params.prepare,
                                      params.contract, found, params.validate_.max_non_numeric_share))


def child_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in (FAULT_ENV, *NODE_INTERFACE_ENVS)}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true", **extra}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory) -> tuple[Path, Path]:
    """Node 0's folder and node 1's: the same prepared data, nothing else shared."""
    root = tmp_path_factory.mktemp("two-nodes")
    node0 = make_project(root / "node0", {"data": {"rows": 2000}, "train": TRAIN}).root
    prepare_in_place(node0)
    shutil.copytree(node0, root / "node1")
    return node0, root / "node1"


def weights(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / "data/train/model.pt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def one_node_two_processes(nodes) -> dict[str, torch.Tensor]:
    """The reference: the same data and settings on one node (standalone torchrun) with two processes."""
    node0, _ = nodes
    set_train(node0, nnodes=1, nproc=2)
    result = subprocess.run([sys.executable, "-m", "tasks.train"], cwd=node0, env=child_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = weights(node0)
    shutil.rmtree(node0 / "data/train")
    return reference


def start_nodes(link: Link, nodes: tuple[Path, Path], max_restarts: int) -> list[subprocess.Popen]:
    """The train stage on both nodes, each in its namespace (rank 1 set to stall after the step-25 checkpoint)."""
    for namespace in link.namespaces:   # whatever a failed test before left running
        stop_processes(namespace)
    port = 29400 + random.randrange(1000)
    for root in nodes:
        shutil.rmtree(root / "data/train", ignore_errors=True)
        set_train(root, nnodes=2, nproc=1, max_restarts=max_restarts, rdzv_endpoint=f"{link.addresses[0]}:{port}",
                  rdzv_id=f"two-nodes-{port}")
    started = []
    for namespace, root in zip(link.namespaces, nodes):
        with (root / "node.log").open("w") as log:
            started.append(subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-m", "tasks.train"],
                                            cwd=root, env=child_env(**{FAULT_ENV: FAULT}), stdout=log,
                                            stderr=subprocess.STDOUT, text=True))
    return started


def wait_for_checkpoint(root: Path, running: list[subprocess.Popen], step: int, timeout: float = 180) -> None:
    manifest = root / "data/train/checkpoints/manifest.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(node.poll() is None for node in running):
        with contextlib.suppress(FileNotFoundError, ValueError):
            if any(entry["step"] == step for entry in json.loads(manifest.read_text())["checkpoints"]):
                return
        time.sleep(0.1)
    raise AssertionError(f"no step-{step} checkpoint on node 0 (exit codes {[node.poll() for node in running]}):\n"
                         + (root / "node.log").read_text()[-3000:])


def is_training_worker(pid: int) -> bool:
    """torchrun's workers, unlike torchrun and the stage that started it, have LOCAL_RANK in their environment."""
    with contextlib.suppress(OSError):
        return any(item.startswith(f"{LOCAL_RANK_ENV}=".encode())
                   for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    return False


def finish(running: list[subprocess.Popen], timeout: float = 240) -> list[int]:
    return [node.wait(timeout=timeout) for node in running]


def test_a_killed_worker_restarts_resumes_and_ends_with_the_weights_of_one_node(link, nodes, one_node_two_processes):
    node0, node1 = nodes
    running = start_nodes(link, nodes, max_restarts=1)
    wait_for_checkpoint(node0, running, CHECKPOINT_STEP)
    workers = [pid for pid in processes_in(link.namespaces[1]) if is_training_worker(pid)]
    assert len(workers) == 1, f"expected node 1's one training worker, found {workers}"
    os.kill(workers[0], signal.SIGKILL)
    codes = finish(running)
    logs = [(root / "node.log").read_text() for root in nodes]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    # torchrun keeps each attempt's worker output apart: node 1's worker ran twice.
    assert sorted(path.name for path in (node1 / "data/train/logs").glob("*/attempt_*")) == ["attempt_0", "attempt_1"]
    unwrapped = "".join(logs[0].replace("[default0]:", "").split())   # rich wraps long log lines
    assert f"resumingfromstep{CHECKPOINT_STEP}(data/train/checkpoints/step-{CHECKPOINT_STEP:08d}.pt)" in unwrapped, \
        logs[0][-3000:]
    assert json.loads((node0 / "data/train/metrics.json").read_text())["world_size"] == 2
    assert not (node1 / "data/train/model.pt").exists(), "only rank 0's node writes the model"
    two_nodes = weights(node0)
    differences = {name: float((two_nodes[name] - tensor).abs().max())
                   for name, tensor in one_node_two_processes.items()}
    assert max(differences.values()) <= WEIGHT_TOLERANCE, differences


def test_a_lost_node_fails_the_other_fast_and_is_named(link, nodes):
    node0, _ = nodes
    running = start_nodes(link, nodes, max_restarts=0)
    wait_for_checkpoint(node0, running, CHECKPOINT_STEP)
    doomed = processes_in(link.namespaces[1])   # the stage, torchrun and its worker: the whole node
    killed_at = time.monotonic()
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    code = running[0].wait(timeout=LOST_NODE_BOUND_S + 60)
    took = time.monotonic() - killed_at
    running[1].wait(timeout=30)
    output = (node0 / "node.log").read_text()
    assert code != 0, output[-3000:]
    assert f"it lost its connection to the node at {link.addresses[1]}" in output, output[-3000:]
    assert took < LOST_NODE_BOUND_S, f"node 0 took {took:.1f} s to fail"
