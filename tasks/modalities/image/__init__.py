"""The image modality: how image files are read, checked, split into shards, baselined, exported, served and watched.

Its parts: `sources` (folders, manifests, packaged sets), `decode` (bytes -> checked pixels, the one reading rule),
`contract` and `expectations` (the image contract and its suite), `prepare` and `splits` (judge, split, write the
shards: `shards`), `layout` and `augment` (what the model takes, label-safe augmentation), `baseline`, `graph` (the
served graph: raw pixels in, probabilities and an embedding out), `requests` (request bodies), `batches` and
`labelled` (the batch door of ingest and the retrain), `watch` (what the monitor compares), `suggest`, and `serving`
(the service's image requests). Importing the package imports none of them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.modalities.image.contract import ImageContract, image_shape
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.interface import Holdout, Labelled, Modality, Split

LABEL = "label"   # the label column of a folder's or a packaged set's images (a manifest names its own column)


class Image(Modality):
    name = "image"
    section, settings = "images", ImagesParams
    contract = ImageContract
    batch_loader = True
    # ONNX Runtime's dynamic int8 of convolutions is slower than fp32 on CPUs (and its answer depends on the batch)
    int8 = ("static",)

    def claims(self, data, params) -> bool:
        from tasks.modalities.image.sources import is_image_source

        return is_image_source(data.source, params.images.path_column)

    def default_target(self, data, params) -> str:
        from tasks.core.errors import ConfigError

        if Path(data.source).is_file():
            raise ConfigError(f"data.target is not set: name the label column of the manifest {data.source} "
                              "(torchship run --set data.target=<column>).")
        return LABEL

    def check_source(self, params, target: str) -> None:
        from tasks.modalities.image.sources import check_image_source

        check_image_source(params.data.source, target, params.images.path_column)

    def fingerprint(self, params) -> dict:
        from tasks.modalities.image.sources import fingerprint_images

        return fingerprint_images(params.data.source, params.images.path_column, params.data.target)

    def source_classes(self, params, target: str) -> int:
        from tasks.modalities.image.layout import source_classes

        return source_classes(params, target)

    def model_probe(self, params, classes: int):
        from tasks.modalities.image.layout import first_image_shape, model_probe

        return model_probe(*first_image_shape(params), classes)

    def prepare(self, params, target: str) -> dict:
        from tasks.modalities.image.splits import prepare_source

        return prepare_source(params, target)

    def validate(self, params, schema):
        from tasks.modalities.image.splits import validate_prepared

        return validate_prepared(params, schema)

    def suggest_contract(self, params, target: str, margin: float):
        from tasks.modalities.image.suggest import suggest_contract

        return suggest_contract(params, target, margin)

    def baselines(self, params, schema, backbone=None) -> tuple[dict, dict]:
        from tasks.modalities.image.baseline import baseline_outputs

        return baseline_outputs(params, schema, backbone)

    def read_split(self, path: Path, schema) -> Split:
        from tasks.core.labels import encode_target
        from tasks.modalities.image.shards import read_metadata, read_pixels

        labels = encode_target(read_metadata(path, schema.target)["label"], schema)
        return Split(read_pixels(path, image_shape(schema).shape), labels)

    def load_holdout(self, schema, path: Path) -> Holdout:
        from tasks.core.labels import encode_target
        from tasks.modalities.image.graph import INPUT
        from tasks.modalities.image.shards import read_metadata, read_pixels

        rows = read_metadata(path, schema.target)
        pixels = read_pixels(path, image_shape(schema).shape)
        return Holdout(rows, pixels, {INPUT: pixels}, encode_target(rows["label"], schema))

    def probe(self, holdout: Holdout, schema, count: int) -> tuple[np.ndarray, np.ndarray]:
        from tasks.modalities.image.graph import probe_images

        images, chosen = probe_images(holdout.inputs, count)
        return images, holdout.labels[chosen]

    def fit_layout(self, inputs: np.ndarray, schema):
        from tasks.modalities.image.layout import fit_image_layout

        return fit_image_layout(inputs, schema)

    def layout_from_dict(self, saved: dict):
        from models.cnn import ImageLayout

        return ImageLayout(**saved)

    def augmentation(self, params):
        return params.images.augment

    def augmenter(self, settings, seed: int):
        from tasks.modalities.image.augment import augmenter

        return augmenter(settings, seed)

    def student(self, distill) -> tuple[str, dict]:
        return "resnet", {"widths": list(distill.widths), "blocks": 1}

    def export_example(self, schema):
        import torch

        return torch.zeros(4, *image_shape(schema).shape, dtype=torch.uint8)

    def traced(self, model, example):
        from tasks.core.runtime import EMBEDDING
        from tasks.modalities.image.graph import ServedImageModel

        return ServedImageModel(model, example).eval(), ["logits", EMBEDDING]

    def compose(self, bare, schema):
        from tasks.modalities.image.graph import compose_image_model

        return compose_image_model(bare, schema)

    def raw_parity(self, name: str, bare_session, served_session, schema, holdout: Holdout, rules,
                   graph: bytes | None = None):
        from tasks.modalities.image.graph import check_raw_parity, probe_images

        return check_raw_parity(name, bare_session, served_session, schema,
                                probe_images(holdout.inputs, rules.probe_rows)[0], rules)

    def feed(self, schema, inputs) -> dict:
        from tasks.modalities.image.graph import INPUT

        return inputs if isinstance(inputs, dict) else {INPUT: inputs}

    def bare_inputs(self, schema, feed) -> np.ndarray:
        from tasks.modalities.image.graph import INPUT

        return feed[INPUT]

    def signature(self, schema, graph: Path, holdout: Holdout):
        from tasks.modalities.image.graph import embedding_width, image_signature

        return holdout.inputs[:2], image_signature(schema, embedding_width(graph))

    def request_bodies(self, holdout: Holdout, schema, count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
        from tasks.modalities.image.requests import request_images

        return request_images(holdout.inputs, count, seed)

    def describe_inputs(self, prepared: dict) -> str:
        height, width = prepared.get("size", ["?", "?"])
        return (f"images {height}x{width} {prepared.get('mode', '?')}, {prepared.get('refused', 0)} refused and "
                "quarantined by the image contract")

    def input_signature(self, schema) -> list[tuple[str, str]]:
        image = image_shape(schema)
        return [("image", f"uint8 {image.height}x{image.width}x{image.channels} {image.mode}")]

    def watched(self, schema):
        from tasks.modalities.image.watch import statistics_schema

        return statistics_schema(schema)

    def reference_frame(self, schema, session, rows: int, seed: int):
        from tasks.modalities.image.watch import reference_frame

        return reference_frame(schema, session, rows, seed)

    def judge_batch(self, path: Path, params, schema) -> Labelled:
        from tasks.modalities.image.labelled import ingest_verdict

        return ingest_verdict(path, params, schema)

    def labelled_batch(self, params, schema, window, since: float, until: float) -> Labelled:
        from tasks.modalities.image.labelled import ingested_batch

        return ingested_batch(since, until)

    def labelled_times(self) -> list[float] | None:
        from tasks.modalities.image.labelled import ingested_times

        return ingested_times()


MODALITY = Image()
