"""The table modality: rows of a CSV or Parquet file (or a built-in table), parsed by the contract, encoded,
baselined with scikit-learn, served as raw JSON rows (one graph input per column) and watched column by column.

Its parts: `sources` (the synthetic generator, scikit-learn's sets, files), `files` and `csv_table` (readers),
`parse` and `contract` (strict parsing, the declared contract), `prepare`, `expectations` (the Great Expectations
suite), `encoding` and `layout` (rows -> the model's matrix), `baseline`, `probe` (export probes and the raw-parity
gate), `graph` (the served graph: raw rows in), `batches` (the batch door of ingest and the retrain), `serving` (the
service's request rows)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.modalities.interface import Holdout, Labelled, Modality, Split
from tasks.modalities.table.contract import Contract


class Table(Modality):
    name = "table"
    fallback = True            # a source no other modality claims is a table
    contract = Contract
    cross_validates = True
    int8 = ("dynamic",)

    def claims(self, data, params) -> bool:
        return False   # the fallback: it claims what no other modality does

    def default_target(self, data, params) -> str:
        from tasks.modalities.table.sources import default_target

        return default_target(data)

    def check_source(self, params, target: str) -> None:
        from tasks.modalities.table.sources import check_source

        check_source(params.data, target)

    def fingerprint(self, params) -> dict:
        from tasks.modalities.table.sources import fingerprint_source

        return fingerprint_source(params.data)

    def source_file(self, data) -> Path | None:
        from tasks.modalities.table.sources import source_path

        return source_path(data)

    def source_classes(self, params, target: str) -> int:
        from tasks.modalities.table.sources import source_classes

        return source_classes(params, target)

    def model_probe(self, params, classes: int):
        from tasks.modalities.table.layout import model_probe

        return model_probe(classes)

    def baselines(self, params, schema, backbone=None) -> tuple[dict, dict]:
        import pandas as pd

        from tasks.core import paths
        from tasks.modalities.table.baseline import baseline_outputs

        return baseline_outputs(pd.read_parquet(paths.TRAIN_SPLIT), pd.read_parquet(paths.HOLDOUT_SPLIT), schema,
                                params.baseline, params.bless.metric)

    def prepare(self, params, target: str) -> dict:
        from tasks.modalities.table.prepare import prepare_source

        return prepare_source(params, target)

    def validate(self, params, schema):
        from tasks.modalities.table.expectations import validate_splits

        return validate_splits(params, schema)

    def keep_refused(self, params, gate):
        from tasks.modalities.table.prepare import keep_refused_source

        return keep_refused_source(params, gate)

    def suggest_contract(self, params, target: str, margin: float):
        from tasks.modalities.table.suggest import suggest_table_contract

        return suggest_table_contract(params, target, margin)

    def read_split(self, path: Path, schema) -> Split:
        import pandas as pd

        from tasks.core.labels import encode_target
        from tasks.modalities.table.encoding import encode_features

        frame = pd.read_parquet(path)
        return Split(encode_features(frame, schema), encode_target(frame[schema.target], schema))

    def load_holdout(self, schema, path: Path) -> Holdout:
        import pandas as pd

        from tasks.core.labels import encode_target
        from tasks.modalities.table.encoding import encode_features, raw_columns

        rows = pd.read_parquet(path)
        return Holdout(rows, encode_features(rows, schema), raw_columns(rows, schema),
                       encode_target(rows[schema.target], schema))

    def probe(self, holdout: Holdout, schema, count: int) -> tuple[np.ndarray, np.ndarray]:
        from tasks.modalities.table.probe import probe_labels, probe_rows

        return probe_rows(holdout.rows, schema, count), probe_labels(holdout.rows, schema, count)

    def fit_layout(self, inputs: np.ndarray, schema):
        from tasks.modalities.table.layout import fit_layout

        return fit_layout(inputs, schema)

    def layout_from_dict(self, saved: dict):
        from models.tabular import FeatureLayout

        return FeatureLayout(**saved)

    def student(self, distill) -> tuple[str, dict]:
        return "mlp", {"hidden": list(distill.hidden), "embedding_dim": distill.embedding_dim, "dropout": 0.0}

    def export_example(self, schema):
        import torch

        return torch.zeros(4, len(schema.features))

    def compose(self, bare, schema):
        from tasks.modalities.table.graph import compose_raw_model

        return compose_raw_model(bare, schema)

    def raw_parity(self, name: str, bare_session, served_session, schema, holdout: Holdout, rules,
                   graph: bytes | None = None):
        from tasks.modalities.table.probe import check_raw_parity, raw_probe_rows

        return check_raw_parity(name, bare_session, served_session, schema,
                                raw_probe_rows(holdout.rows, schema, rules.probe_rows), rules)

    def feed(self, schema, inputs) -> dict:
        from tasks.modalities.table.encoding import raw_columns

        return inputs if isinstance(inputs, dict) else raw_columns(inputs, schema)

    def bare_inputs(self, schema, feed) -> np.ndarray:
        import pandas as pd

        from tasks.modalities.table.encoding import encode_features

        return encode_features(pd.DataFrame(feed), schema)

    def signature(self, schema, graph: Path, holdout: Holdout):
        from tasks.modalities.table.graph import client_rows, raw_signature

        return client_rows(holdout.rows.head(5), schema), raw_signature(schema)

    def request_bodies(self, holdout: Holdout, schema, count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
        from tasks.modalities.table.requests import request_rows

        return request_rows(holdout.rows, schema.feature_names, count, seed)

    def describe_inputs(self, prepared: dict) -> str:
        kinds = prepared.get("features", {})
        return f"features: {kinds.get('numeric', '?')} numeric, {kinds.get('categorical', '?')} categorical"

    def input_signature(self, schema) -> list[tuple[str, str]]:
        return [(f.name, f.kind) for f in schema.features]

    def watched(self, schema):
        return schema

    def reference_frame(self, schema, session, rows: int, seed: int):
        from tasks.modalities.table.watch import reference_frame

        return reference_frame(schema, session, rows, seed)

    def judge_batch(self, path: Path, params, schema) -> Labelled:
        from tasks.modalities.table.batches import ingest_verdict

        return ingest_verdict(path, params, schema)

    def labelled_batch(self, params, schema, window, since: float, until: float) -> Labelled:
        from tasks.modalities.table.batches import window_verdict

        return window_verdict(params, schema, window, since, until)


MODALITY = Table()
