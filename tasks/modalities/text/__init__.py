"""The text modality: texts read, judged by the text contract, split with near copies kept together, tokenized by the
run's own tokenizer (fitted on the training split, carried in the schema and inside the served graph), baselined with
TF-IDF, served as raw strings and watched by their descriptors and the model's embedding (docs/text.md).

Its parts: `sources` and `generated` (tables, folders of .txt files, packaged sets), `checks`, `near_duplicates`,
`contract` and `expectations` (the text contract and its suite), `prepare`, `splits` and `shards` (judge, split,
write), `tokenizer` and `inputs` (the tokenizer artifact, as the schema carries it), `pretrained` (a pretrained
encoder's checkpoint and the tokenizer it carries), `layout` (what a model takes, probes), `baseline`, `graph`,
`traced`, `gate` and `parity` (the served graph: raw strings in, what export traces, its tokenization gate),
`requests`, `labelled` (the batch door of ingest and the retrain), `descriptors` and `watch` (what the monitor
compares), `suggest`, `batch` (`torchship predict`) and `serving` (the service's text requests). Importing the
package imports none of them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.modalities.interface import Holdout, Labelled, Modality, Split
from tasks.modalities.text.contract import TextContract
from tasks.modalities.text.settings import TextParams

LABEL = "label"   # the label column of a folder's or a packaged set's texts (a table names its own column)


class Text(Modality):
    name = "text"
    section, settings = "text", TextParams
    contract = TextContract
    # ONNX Runtime's dynamic int8 of the Linear layers (and embedding tables): what suits NLP models on CPUs
    int8 = ("dynamic",)

    def claims(self, data, params) -> bool:
        from tasks.modalities.text.sources import looks_like_text

        return looks_like_text(data.source, data.target)

    def default_target(self, data, params) -> str:
        from tasks.core.errors import ConfigError
        from tasks.modalities.text.sources import is_packaged

        if not is_packaged(data.source) and Path(data.source).is_file():
            raise ConfigError(f"data.target is not set: name the label column of {data.source} "
                              "(torchship run --set data.target=<column>).")
        return LABEL

    def check_source(self, params, target: str) -> None:
        from tasks.modalities.text.pretrained import pretrained_tokenizer
        from tasks.modalities.text.sources import check_text_source
        from tasks.modalities.text.splits import text_settings

        check_text_source(params.data.source, target, text_settings(params).text_column)
        pretrained_tokenizer(params.train.pretrained)   # a text checkpoint without its own tokenizer: refused now

    def fingerprint(self, params) -> dict:
        from tasks.modalities.text.sources import fingerprint_texts

        return fingerprint_texts(params.data.source)

    def source_file(self, data) -> Path | None:
        path = Path(data.source)
        return path if path.is_file() else None

    def source_classes(self, params, target: str) -> int:
        from tasks.modalities.text.layout import source_classes

        return source_classes(params, target)

    def model_probe(self, params, classes: int):
        from tasks.modalities.text.layout import model_probe

        return model_probe(params, classes)

    def prepare(self, params, target: str) -> dict:
        from tasks.modalities.text.splits import prepare_source

        return prepare_source(params, target)

    def validate(self, params, schema):
        from tasks.modalities.text.splits import validate_prepared

        return validate_prepared(params, schema)

    def suggest_contract(self, params, target: str, margin: float):
        from tasks.modalities.text.suggest import suggest_contract

        return suggest_contract(params, target, margin)

    def baselines(self, params, schema, backbone=None) -> tuple[dict, dict]:
        from tasks.core import paths
        from tasks.modalities.text.baseline import baseline_report
        from tasks.modalities.text.shards import read_texts

        train, holdout = (self.read_split(path, schema) for path in (paths.TRAIN_SPLIT, paths.HOLDOUT_SPLIT))
        probe = None
        if backbone is not None:   # the frozen encoder's features: the linear probe joins, as the gate's baseline
            features = backbone(train.inputs)
            probe = (features(train.inputs), features(holdout.inputs))
        return baseline_report(read_texts(paths.TRAIN_SPLIT), train.labels, read_texts(paths.HOLDOUT_SPLIT),
                               holdout.labels, schema.classes, params.baseline, params.bless.metric, probe)

    def read_split(self, path: Path, schema) -> Split:
        from tasks.core.labels import encode_target
        from tasks.modalities.text.inputs import schema_tokenizer
        from tasks.modalities.text.shards import read_metadata, read_texts

        labels = encode_target(read_metadata(path)[LABEL], schema)
        return Split(schema_tokenizer(schema).encode(read_texts(path)), labels)

    def load_holdout(self, schema, path: Path) -> Holdout:
        from tasks.core.labels import encode_target
        from tasks.modalities.text.graph import text_feed
        from tasks.modalities.text.inputs import schema_tokenizer
        from tasks.modalities.text.shards import read_metadata, read_texts

        rows, texts = read_metadata(path), read_texts(path)
        return Holdout(rows, schema_tokenizer(schema).encode(texts), text_feed(texts),
                       encode_target(rows[LABEL], schema))

    def probe(self, holdout: Holdout, schema, count: int) -> tuple[np.ndarray, np.ndarray]:
        from tasks.modalities.text.inputs import text_shape
        from tasks.modalities.text.layout import probe_ids

        ids, chosen = probe_ids(holdout.inputs, count, text_shape(schema).vocab_size)
        return ids, holdout.labels[chosen]

    def fit_layout(self, inputs: np.ndarray, schema):
        from tasks.modalities.text.layout import fit_text_layout

        return fit_text_layout(schema)

    def layout_from_dict(self, saved: dict):
        from models.text import TextLayout

        return TextLayout(**saved)

    def large_from(self, params) -> tuple[int, str]:
        return params.text.transformer_min_rows, "text.transformer_min_rows"

    def student(self, distill) -> tuple[str, dict]:
        # A quarter of the student MLP's width: 16 by default, half the teacher bag's 32 (a student as wide as its
        # teacher would compress nothing, and with hundreds of character n-grams a text its epochs cost the most).
        return "bag", {"dim": max(8, distill.hidden[0] // 4)}

    def export_example(self, schema):
        import torch

        from tasks.modalities.text.inputs import text_shape

        return torch.zeros(4, text_shape(schema).width, dtype=torch.int64)

    def traced(self, model, example):
        from tasks.core.runtime import EMBEDDING
        from tasks.modalities.text.traced import ServedTextModel

        return ServedTextModel(model, example).eval(), ["logits", EMBEDDING]

    def compose(self, bare, schema):
        from tasks.modalities.text.graph import compose_text_model
        from tasks.modalities.text.inputs import schema_tokenizer

        return compose_text_model(bare, schema, schema_tokenizer(schema))

    def raw_parity(self, name: str, bare_session, served_session, schema, holdout: Holdout, rules,
                   graph: bytes | None = None):
        from tasks.modalities.text.graph import TEXT_INPUT
        from tasks.modalities.text.parity import check_raw_parity

        return check_raw_parity(name, bare_session, served_session, schema, list(holdout.feed[TEXT_INPUT]), rules,
                                graph)

    def feed(self, schema, inputs) -> dict:
        from tasks.modalities.text.graph import text_feed

        return inputs if isinstance(inputs, dict) else text_feed(list(inputs))

    def bare_inputs(self, schema, feed) -> np.ndarray:
        from tasks.modalities.text.graph import TEXT_INPUT
        from tasks.modalities.text.inputs import schema_tokenizer

        return schema_tokenizer(schema).encode(list(feed[TEXT_INPUT]))

    def signature(self, schema, graph: Path, holdout: Holdout):
        import pandas as pd

        from tasks.modalities.text.graph import TEXT_INPUT, projected_width, text_signature

        example = pd.DataFrame({TEXT_INPUT: list(holdout.feed[TEXT_INPUT][:2])})
        return example, text_signature(schema, projected_width(graph))

    def request_bodies(self, holdout: Holdout, schema, count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
        from tasks.modalities.text.graph import TEXT_INPUT
        from tasks.modalities.text.requests import request_texts

        return request_texts(list(holdout.feed[TEXT_INPUT]), count, seed)

    def describe_inputs(self, prepared: dict) -> str:
        return (f"texts (column '{prepared.get('column', '?')}'), a tokenizer of {prepared.get('vocabulary', '?')} "
                f"ids fitted on the training split ({prepared.get('tokens_per_text', '?')} tokens a text, sha256 "
                f"{str(prepared.get('tokenizer_sha256', '?'))[:12]}), {prepared.get('refused', 0)} refused and "
                "quarantined by the text contract")

    def input_signature(self, schema) -> list[tuple[str, str]]:
        # raw strings: two text models are comparable whatever tokenizer each fitted (each carries its own)
        return [("text", "string")]

    def watched(self, schema):
        from tasks.modalities.text.watch import descriptor_schema

        return descriptor_schema(schema)

    def reference_frame(self, schema, session, rows: int, seed: int):
        from tasks.modalities.text.watch import reference_frame

        return reference_frame(schema, session, rows, seed)

    def judge_batch(self, path: Path, params, schema) -> Labelled:
        from tasks.modalities.text.labelled import ingest_verdict

        return ingest_verdict(path, params, schema)

    def labelled_batch(self, params, schema, window, since: float, until: float) -> Labelled:
        from tasks.modalities.text.labelled import ingested_batch

        return ingested_batch(since, until)

    def labelled_times(self) -> list[float] | None:
        from tasks.modalities.text.labelled import ingested_times

        return ingested_times()


MODALITY = Text()
