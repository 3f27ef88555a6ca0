"""Real ONNX graphs made slower by construction, and a CPU hog to run them beside: what the latency gates must tell
apart (a slow model on a busy box from a fast one on a busy box)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper


def through(model: onnx.ModelProto, nodes: list, initializers: list) -> onnx.ModelProto:
    """The model with its `probabilities` output routed through `nodes` (which read `inner` and write
    `probabilities`), placed right after the node that made them: what reads `probabilities` downstream (the
    graph's `decision` output) reads the new ones."""
    graph = list(model.graph.node)
    [made] = [i for i, node in enumerate(graph) if "probabilities" in node.output]
    graph[made].output[:] = ["inner" if name == "probabilities" else name for name in graph[made].output]
    del model.graph.node[:]
    model.graph.node.extend(graph[:made + 1] + nodes + graph[made + 1:])
    model.graph.initializer.extend(initializers)
    onnx.checker.check_model(model)
    return model


def slowed(model: onnx.ModelProto, products: int, size: int = 512) -> onnx.ModelProto:
    """The same answers after `products` size x size matrix products that depend on the input (nothing to fold
    away): about 4 ms each at 512 on one core of the test machines."""
    nodes = [helper.make_node("ReduceSum", ["inner"], ["total"]),
             helper.make_node("Mul", ["weights", "total"], ["m0"])]
    for i in range(products):
        nodes.append(helper.make_node("MatMul", [f"m{i}", "weights"], [f"m{i + 1}"]))
    nodes += [helper.make_node("ReduceSum", [f"m{products}"], ["spent"]),
              helper.make_node("Mul", ["spent", "zero"], ["nothing"]),
              helper.make_node("Add", ["inner", "nothing"], ["probabilities"])]
    return through(model, nodes, [numpy_helper.from_array(np.full((size, size), 1e-3, np.float32), "weights"),
                                  numpy_helper.from_array(np.array(0.0, np.float32), "zero")])


def runnable_elsewhere() -> int:
    """Tasks runnable on the box right now besides the caller (/proc/loadavg's running count)."""
    try:
        with open("/proc/loadavg") as handle:
            return max(0, int(handle.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return 0


@contextlib.contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[None]:
    """Busy loops in processes of their own for the block: a box as busy as a CI runner sharing its cores. By
    default enough to keep one more task runnable than there are cores, counting what already runs (beside the
    whole suite that is often one loop: more would only slow the other tests), and never fewer than one. Stopped by
    PID on every way out."""
    wanted = processes or max(1, (os.cpu_count() or 1) + 1 - runnable_elsewhere())
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(wanted)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
