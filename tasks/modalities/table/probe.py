"""The table's export probes and its served graph's gate: holdout rows plus edge rows (encoded for the bare
model, raw as a client sends them for the served graph), and the raw-parity gate (Python encoding + the bare
variant vs the composed graph on the same raw rows)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.gate import GateResult
from tasks.core.labels import encode_target
from tasks.core.params_spec import ExportParams
from tasks.core.schema_spec import Schema
from tasks.modalities.scoring import predict_proba
from tasks.modalities.table.encoding import encode_features
from tasks.modalities.table.graph import WHITESPACE, client_rows


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
