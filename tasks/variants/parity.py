"""The parity gate every exported variant passes: same logits and same argmax as eager on a probe set."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from tasks.config import ExportParams
from tasks.contract import Schema, encode_features
from tasks.core.artifacts import sha256_file
from tasks.core.gate import GateResult
from tasks.core.runtime import Runner

log = logging.getLogger("torchship.parity")


def probe_rows(holdout: pd.DataFrame, schema: Schema, count: int, seed: int = 0) -> np.ndarray:
    """Holdout rows plus edge rows: all-missing, extreme numbers, unseen and negative category codes."""
    sample = holdout.sample(n=min(count, len(holdout)), random_state=seed)
    rows = encode_features(sample, schema)
    edges = [np.full(len(schema.features), np.nan, dtype=np.float32)]
    for j, feature in enumerate(schema.features):
        for value in ((1e4, -1e4) if feature.kind == "numeric" else (len(feature.categories) + 7, -3)):
            edge = rows[0].copy()
            edge[j] = value
            edges.append(edge)
    return np.vstack([rows, np.stack(edges)]).astype(np.float32)


def check_parity(name: str, eager: np.ndarray, variant: np.ndarray, rules: ExportParams) -> GateResult:
    """Logits within atol (scaled by the logit's size) and argmax agreement on the probe set."""
    scale = np.maximum(1.0, np.abs(eager))
    diff = np.abs(eager - variant) / scale
    worst = diff.max(axis=1)
    agreement = float((eager.argmax(1) == variant.argmax(1)).mean())
    failures = []
    diverging = np.flatnonzero(worst > rules.parity_atol)
    if len(diverging):
        failures.append(f"{len(diverging)} probe rows exceed atol {rules.parity_atol:g} "
                        f"(rows {diverging[:10].tolist()}, worst {worst.max():.3g})")
    if agreement < rules.min_argmax_agreement:
        failures.append(f"argmax agreement {agreement:.4f} < {rules.min_argmax_agreement}")
    return GateResult.decide(f"parity {name}", failures, passed=f"max scaled diff {worst.max():.2e}, "
                                                                f"argmax agreement {agreement:.4f}")


def publish_variant(name: str, eager: np.ndarray, probe: np.ndarray, rules: ExportParams,
                    make: Callable[[], None] | None, runner: Callable[[], Runner],
                    path: Path | None = None, required: bool = False) -> tuple[dict, GateResult]:
    """Build one variant (a file, or a runtime option when `path` is None), run it on the probe set,
    and gate it on parity with eager. Returns its report entry and the gate. A variant that cannot be
    built is a failed gate, unless it is `required` (the served format): then the error propagates."""
    started = time.perf_counter()
    try:
        if make:
            make()
        gate = check_parity(name, eager, runner()(probe), rules)
    except Exception as exc:  # an exporter or compiler that breaks on this model: the variant is not published
        if required:
            raise
        gate = GateResult.decide(f"parity {name}", [f"could not be built or run: {type(exc).__name__}: {exc}"])
    entry = {"seconds": round(time.perf_counter() - started, 2), "publishable": gate.status != "fail",
             "gate": gate.model_dump()}
    if path is not None and path.exists():
        entry.update(path=str(path), bytes=path.stat().st_size, sha256=sha256_file(path))
    log.info("%s: %s", name, gate.summary())
    return entry, gate
