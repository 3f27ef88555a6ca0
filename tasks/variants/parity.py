"""The parity gate: every exported variant against eager (same logits and argmax on a probe set, and the accuracy
delta on its holdout part). Each modality gates its served raw-input graph against its bare variant itself."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.core.artifacts import sha256_file
from tasks.core.gate import GateResult
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import Runner

log = logging.getLogger("torchship.parity")


def check_parity(name: str, eager: np.ndarray, variant: np.ndarray, rules: ExportParams,
                 labels: np.ndarray | None = None) -> GateResult:
    """Logits within atol (scaled by the logit's size) and argmax (top-1) agreement on the probe set; with the
    `labels` of its first rows (real holdout rows or images), the accuracy of the variant against eager's there."""
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
    accuracy = ""
    if labels is not None and len(labels):
        delta = float((variant[:len(labels)].argmax(1) == labels).mean() - (eager[:len(labels)].argmax(1) == labels)
                      .mean())
        accuracy = f", holdout accuracy {delta * 100:+.2f} points vs eager on {len(labels)} rows"
        if abs(delta) > rules.max_accuracy_delta:
            failures.append(f"holdout accuracy moved {delta * 100:+.2f} points vs eager on {len(labels)} rows "
                            f"(rule: export.max_accuracy_delta {rules.max_accuracy_delta:g})")
    return GateResult.decide(f"parity {name}", failures, passed=f"max scaled diff {worst.max():.2e}, "
                                                                f"argmax agreement {agreement:.4f}{accuracy}")


def publish_variant(name: str, eager: np.ndarray, probe: np.ndarray, rules: ExportParams,
                    make: Callable[[], None] | None, runner: Callable[[], Runner],
                    path: Path | None = None, required: bool = False,
                    labels: np.ndarray | None = None) -> tuple[dict, GateResult]:
    """Build one variant (a file, or a runtime option when `path` is None), run it on the probe set,
    and gate it on parity with eager. Returns its report entry and the gate. A variant that cannot be
    built is a failed gate, unless it is `required` (the served format): then the error propagates."""
    started = time.perf_counter()
    try:
        if make:
            make()
        gate = check_parity(name, eager, runner()(probe), rules, labels)
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
