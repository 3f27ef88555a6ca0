"""The parity gates: every exported variant against eager (same logits and argmax on a probe set), and the
served raw-input graph against Python encoding + its variant (same probabilities and class on raw rows)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.artifacts import sha256_file
from tasks.core.encoding import encode_features, encode_target
from tasks.core.gate import GateResult
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import Runner, predict_proba
from tasks.core.schema_spec import Schema
from tasks.variants.preprocess import WHITESPACE, client_rows

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


def probe_labels(holdout: pd.DataFrame, schema: Schema, count: int, seed: int = 0) -> np.ndarray:
    """The class indices of `probe_rows`' holdout rows (its first rows), in its order."""
    sample = holdout.sample(n=min(count, len(holdout)), random_state=seed)
    return encode_target(sample[schema.target], schema)


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


def raw_probe_rows(holdout: pd.DataFrame, schema: Schema, count: int, seed: int = 0) -> pd.DataFrame:
    """Raw holdout rows as a client sends them (missing = None), plus edge rows: all missing, numbers far out
    or missing, and per category unseen, blank, missing, padded with spaces, tabs, newlines or no-break
    spaces, with inner runs, with an extra token."""
    sample = holdout.sample(n=min(count, len(holdout)), random_state=seed)
    rows = client_rows(sample, schema).to_dict("records")
    edges = [dict.fromkeys(schema.feature_names), dict.fromkeys(schema.feature_names, np.nan)]
    for feature in schema.features:
        known = feature.categories[0] if feature.categories else "a"
        values = ((1e4, -1e4, None) if feature.kind == "numeric" else
                  ("never-seen-in-training", "", "   ", None, f"  {known}  ", f"\t{known}\n", f"\u00a0{known}\u3000",
                   known.replace(" ", " \t "), f"{known} extra", f" {known.upper()} "))
        edges += [{**rows[0], feature.name: value} for value in values]
    return pd.DataFrame(rows + edges, columns=schema.feature_names)


def spaces_only(rows: pd.DataFrame, schema: Schema) -> pd.Series:
    """Rows whose text holds no whitespace but plain spaces (a raw graph's StringSplit path, not its regex one)."""
    other = set(WHITESPACE) - {" "}
    text = [rows[f.name].map(lambda v: not (isinstance(v, str) and other & set(v))) for f in schema.features
            if f.kind == "categorical"]
    return pd.concat(text, axis=1).all(axis=1) if text else pd.Series(True, index=rows.index)


def check_image_raw_parity(name: str, variant, composed, schema: Schema, probe: np.ndarray,
                           rules: ExportParams) -> GateResult:
    """The bare image variant (pixels as `x`) vs the served graph (pixels as `image`) on the probe images:
    probabilities within parity_atol and the same class on every image."""
    reference, raw = predict_proba(variant, schema, probe), predict_proba(composed, schema, probe)
    diff = np.nan_to_num(np.abs(reference - raw), nan=np.inf).max(axis=1)
    failures = []
    if (diff > rules.parity_atol).any():
        failures.append(f"{int((diff > rules.parity_atol).sum())} of {len(probe)} probe images differ by more than "
                        f"export.parity_atol {rules.parity_atol:g} (worst {diff.max():.3g})")
    flipped = np.flatnonzero(reference.argmax(1) != raw.argmax(1))
    if len(flipped):
        failures.append(f"{len(flipped)} probe images change class (images {flipped[:10].tolist()})")
    return GateResult.decide(f"raw parity {name}", failures,
                             passed=f"max probability diff {diff.max():.2e}, same class on all {len(probe)} images")


def check_raw_parity(name: str, variant, composed, schema: Schema, probe: pd.DataFrame,
                     rules: ExportParams) -> GateResult:
    """Python encoding + the bare variant vs the composed graph on the same raw batches (batch-dependent int8
    variants see identical inputs): probabilities within parity_atol (NaN only where both are NaN) and the same
    class on every row. The plain-space rows are scored alone too: the graph picks its path per batch."""
    diverging, flipped, worst = set(), set(), 0.0
    for batch in (probe[spaces_only(probe, schema)], probe):   # the graph's StringSplit path, then its regex path
        if batch.empty:
            continue
        reference, raw = predict_proba(variant, schema, batch), predict_proba(composed, schema, batch)
        diff = np.abs(reference - raw)
        diff[np.isnan(reference) & np.isnan(raw)] = 0.0
        diff = np.nan_to_num(diff, nan=np.inf).max(axis=1)
        worst = max(worst, float(diff.max()))
        diverging |= set(batch.index[diff > rules.parity_atol].tolist())
        flipped |= set(batch.index[reference.argmax(1) != raw.argmax(1)].tolist())
    failures = []
    if diverging:
        failures.append(f"{len(diverging)} of {len(probe)} raw probe rows differ by more than export.parity_atol "
                        f"{rules.parity_atol:g} (rows {sorted(diverging)[:10]}, worst {worst:.3g})")
    if flipped:
        failures.append(f"{len(flipped)} raw probe rows change class (rows {sorted(flipped)[:10]})")
    return GateResult.decide(f"raw parity {name}", failures,
                             passed=f"max probability diff {worst:.2e}, same class on all {len(probe)} raw rows")
