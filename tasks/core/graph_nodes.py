"""Building ONNX graphs around an exported model, for every modality: fresh tensor names under one prefix, the
served label as a one-hot `decision` output, and the opset the fronts need."""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper, version_converter

from tasks.core.runtime import DECISION

OPSET = 20      # StringSplit, StringConcat and RegexFullMatch (earlier models are converted up)
INNER = "torchship/"                    # prefix of every tensor that is not an input or an output
MODEL = f"{INNER}model/"                # the bare model's names, prefixed: its input x and output logits too


class GraphNodes:
    """Nodes of one (sub)graph, with fresh tensor names under INNER."""

    def __init__(self, tag: str):
        self.tag, self.nodes = tag, []

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs) -> str | list[str]:
        names = [f"{INNER}{self.tag}/{len(self.nodes)}.{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, value, dtype: int) -> str:
        shape = [] if not isinstance(value, list) else [len(value)]
        return self.op("Constant", value=helper.make_tensor("value", dtype, shape, value if shape else [value]))

    def graph(self, output: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(output, TensorProto.INT64, None)
        return helper.make_graph(self.nodes, self.tag, [], [out])


def decision_nodes(b: GraphNodes, threshold: float | None, n_classes: int) -> None:
    """One-hot (N, C) int64 of the served label: class 1 where P(class 1) > threshold (the binary decision rule,
    tasks.core.runtime.decide), else the argmax. One-hot rather than (N,) indices: MLflow's pyfunc flattens every
    output into one column of a frame, so all outputs must have the same N*C values."""
    if threshold is None:
        index = b.op("ArgMax", "probabilities", axis=1, keepdims=0)
    else:
        positive = b.op("Gather", "probabilities", b.const(1, TensorProto.INT64), axis=1)   # (N,) P(class 1)
        index = b.op("Cast", b.op("Greater", positive, b.const(threshold, TensorProto.FLOAT)), to=TensorProto.INT64)
    b.nodes.append(helper.make_node("OneHot", [index, b.const([n_classes], TensorProto.INT64),
                                               b.const([0, 1], TensorProto.INT64)], [DECISION], axis=-1))


def at_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model at OPSET or later (an opset-17 legacy export is converted; its ops keep their meaning)."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    return model if version >= OPSET else version_converter.convert_version(model, OPSET)


def assemble(inner: onnx.ModelProto, front: list, inputs: list, outputs: list, threshold: float | None,
             n_classes: int, metadata: dict[str, str], name: str, opsets: dict[str, int] | None = None,
             passed: tuple[str, ...] = ()) -> onnx.ModelProto:
    """One checked model: the `front` nodes (which write the inner model's prefixed input), the inner model (its
    names under MODEL), then `logits`, `probabilities` (softmax), the `decision` one-hot, and each of `passed`
    (further inner outputs, by their own names); `opsets` raises a domain's version where the front needs it."""
    tail = [helper.make_node("Identity", [f"{MODEL}logits"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
            *(helper.make_node("Identity", [f"{MODEL}{output}"], [output]) for output in passed)]
    decide = GraphNodes("decision")
    decision_nodes(decide, threshold, n_classes)
    graph = helper.make_graph([*front, *inner.graph.node, *tail, *decide.nodes], name, inputs, outputs,
                              initializer=inner.graph.initializer, value_info=inner.graph.value_info)
    versions = {o.domain or "ai.onnx": o.version for o in inner.opset_import}
    for domain, version in (opsets or {}).items():
        versions[domain] = max(versions.get(domain, version), version)
    composed = helper.make_model(graph, ir_version=inner.ir_version, opset_imports=[
        helper.make_opsetid("" if domain == "ai.onnx" else domain, version) for domain, version in versions.items()])
    composed.functions.extend(inner.functions)
    helper.set_model_props(composed, metadata)
    onnx.checker.check_model(composed)
    return composed
