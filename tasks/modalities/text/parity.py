"""The served text graph's gate before it is written: first the tokenization gate (tasks/modalities/text/gate.py:
the graph's own token ids equal the training tokenizer's on the whole holdout and on the adversarial strings), then
probabilities parity: the served graph on raw strings against the bare variant on the Python tokenizer's ids, on
holdout texts and the adversarial strings, within export.parity_atol and the same class on every text."""
from __future__ import annotations

import numpy as np

from tasks.core.gate import GateResult
from tasks.core.params_spec import ExportParams
from tasks.core.schema_spec import Schema
from tasks.modalities.scoring import predict_proba
from tasks.modalities.text.gate import ADVERSARIAL, shown, tokenization_gate
from tasks.modalities.text.graph import text_feed, tokenizer_graph
from tasks.modalities.text.inputs import schema_tokenizer


def served_graph(graph: bytes | None, schema: Schema):
    """(what the tokenization gate reads, in words): the served graph itself (the gate reads the ids its own front
    end feeds the model), else the front end the schema's tokenizer builds."""
    if graph is not None:
        import onnx

        return onnx.load_from_string(graph), "the served graph's own front end"
    return tokenizer_graph(schema_tokenizer(schema)), "the front end the schema's tokenizer builds"


def check_raw_parity(name: str, bare_session, served_session, schema: Schema, texts: list[str],
                     rules: ExportParams, served: bytes | None = None) -> GateResult:
    """Tokenization first (every holdout text), then probabilities parity on `rules.probe_rows` holdout texts and
    ADVERSARIAL."""
    gate_name = f"raw parity {name}"
    graph, which = served_graph(served, schema)
    tokens = tokenization_gate(schema_tokenizer(schema), graph, texts)
    if tokens.status == "fail":
        return GateResult(gate=gate_name, status="fail", reasons=[f"tokenization gate ({which}): {r}"
                                                                   for r in tokens.reasons])
    probe = list(texts[:rules.probe_rows]) + list(ADVERSARIAL)
    reference = predict_proba(bare_session, schema, text_feed(probe))
    raw = predict_proba(served_session, schema, text_feed(probe))
    diff = np.nan_to_num(np.abs(reference - raw), nan=np.inf).max(axis=1)
    checks = ((np.flatnonzero(diff > rules.parity_atol), f"differ by more than export.parity_atol "
                                                         f"{rules.parity_atol:g} (worst {diff.max():.3g})"),
              (np.flatnonzero(reference.argmax(1) != raw.argmax(1)), "change class"))
    failures = [f"{len(found)} of {len(probe)} probe texts {what}, e.g. "
                + ", ".join(shown(probe[i]) for i in found[:3]) for found, what in checks if len(found)]
    return GateResult.decide(gate_name, failures,
                             passed=f"{tokens.reasons[0]} ({which}); max probability diff {diff.max():.2e}, same class "
                                    f"on all {len(probe)} texts ({len(ADVERSARIAL)} adversarial)")
