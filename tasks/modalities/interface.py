"""The one interface every modality supplies (docs/development.md, "add a modality"): the parts the architecture
names, as methods of one object. The steps, the training engine, the service and the monitor call these and never
ask which modality they hold; what a modality needs of them (a model's layout, a served graph, request bodies, the
columns the monitor watches) comes back in shapes every modality shares:

- a split is read as `Split`: the bare model's inputs (an array) and the labels as class indices;
- the holdout is `Holdout`: its rows (metadata, for slices and reports), the bare model's inputs, and the `feed` of
  the served graph (input name -> array: the raw inputs a client sends), and the labels;
- request bodies are JSON-able dicts, as a client posts them to /predict.

Each method's docstring says what it must do; a modality package implements them with its own modules, imported
inside the method (importing a modality object is cheap: the loader reads its params section from it)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

Feed = dict[str, np.ndarray]   # a served graph's inputs by name: what a client's request becomes


@dataclass(frozen=True)
class Split:
    inputs: np.ndarray   # what the bare model takes: encoded rows (N, F) float32, pixels (N, H, W, C) uint8, ids
    labels: np.ndarray   # (N,) class indices


@dataclass(frozen=True)
class Holdout:
    rows: pd.DataFrame   # one row per item as prepared (features or metadata, and the target)
    inputs: np.ndarray   # the bare model's inputs, as `Split`
    feed: Feed           # the served graph's raw inputs
    labels: np.ndarray   # (N,) class indices

    def take(self, positions) -> Feed:
        """The feed of the items at `positions` (an index array or a slice)."""
        return {name: values[positions] for name, values in self.feed.items()}


@dataclass(frozen=True)
class Probe:
    """What the own-model probe (tasks/training/probe.py) builds a user's module for and runs it on."""

    layout: Any              # the layout the module is built with
    inputs: Any              # (PROBE_BATCH, ...) torch tensor of the modality's raw model input
    what: str                # the input in words, for the messages


PROBE_BATCH = 6


@dataclass(frozen=True)
class Suggestion:
    """A contract proposed from reference data by `torchship contract suggest`, for a person to review."""

    contract: Any            # the modality's contract spec
    origin: str              # where the reference came from
    items: int               # rows, images or texts profiled
    unit: str                # "rows", "images", "texts"
    notes: list[str]         # what was left out of the profile, and why


@dataclass(frozen=True)
class Labelled:
    """A labelled batch judged at a modality's batch door (`torchship ingest`, or a retrain's new examples)."""

    gate: Any                            # the batch gate (tasks/core/gate.py GateResult)
    offered: int                         # labelled items the batch held
    accepted: int
    quarantined: int
    store: Callable[[], Path] | None     # writes the accepted items under data/batches/ (None: nothing to keep)
    quarantine: str | None = None        # where refused items went, with report.json


class Modality:
    """One kind of data. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]
    fallback: ClassVar[bool] = False          # the modality of a source no other claims
    section: ClassVar[str | None] = None      # its params.yaml section (settings: its spec)
    settings: ClassVar[type | None] = None
    contract: ClassVar[type | None] = None    # its `contract:` spec (with a `modality` literal field), or None
    cross_validates: ClassVar[bool] = False   # small training sets train k-fold members (tasks/training/crossval.py)
    batch_loader: ClassVar[bool] = False      # a large split may feed training through a DataLoader
    int8: ClassVar[tuple[str, ...]] = ()      # ONNX Runtime int8 kinds that suit it: "dynamic", "static"

    # -- the source ---------------------------------------------------------------------------------------------
    def claims(self, data, params) -> bool:
        """Whether `data.source` holds this kind of data (cheap: a prefix, a folder listing, a file's header)."""
        raise NotImplementedError

    def default_target(self, data, params) -> str:
        """The label column when `data.target` and the contract name none (ConfigError where one must be named)."""
        raise NotImplementedError

    def check_source(self, params, target: str) -> None:
        """Refuse in a second what prepare would refuse after a while (a missing file, folder or column)."""
        raise NotImplementedError

    def fingerprint(self, params) -> dict:
        """What identifies the source's content (DVC hashes it: a change re-runs prepare)."""
        raise NotImplementedError

    def source_file(self, data) -> Path | None:
        """The one file behind the source, for a quarantine copy of a refused source (None: none, or many)."""
        return None

    def source_classes(self, params, target: str) -> int:
        """How many classes the source's labels hold, read cheaply (class folders, a label column alone), so a module
        built for another count fails before prepare; 3 where it cannot be read (prepare then names the problem)."""
        raise NotImplementedError

    def model_probe(self, params, classes: int) -> Probe:
        """A layout and a batch of this modality's raw model input that a user's module must take: every kind of
        value a split can hold (missing numbers, unseen codes, black and white images, empty texts)."""
        raise NotImplementedError

    def baselines(self, params, schema, backbone: Callable | None = None) -> tuple[dict, dict]:
        """(the baseline report: {metric, models, gate, headline, ...}, the gate's holdout predictions); with a
        `backbone` (train inputs -> a frozen backbone's features function) a linear probe joins them."""
        raise NotImplementedError

    # -- prepare, validate, contracts ------------------------------------------------------------------------
    def prepare(self, params, target: str) -> dict:
        """Read, judge, quarantine, split and write the splits and the schema; return prepare's metrics (with its
        `headline`) and log nothing."""
        raise NotImplementedError

    def validate(self, params, schema) -> tuple[Any, list[dict]]:
        """The Great Expectations gate on the written splits: (GateResult, one row per expectation)."""
        raise NotImplementedError

    def keep_refused(self, params, gate):
        """After a blocking validation: keep a copy of what was refused and say where (the gate, amended)."""
        return gate

    def suggest_contract(self, params, target: str, margin: float) -> Suggestion:
        """A contract proposed from `params.data.source` (reference data): ranges widened by `margin`, accepting
        everything the reference holds."""
        raise NotImplementedError

    # -- model inputs ---------------------------------------------------------------------------------------
    def read_split(self, path: Path, schema) -> Split:
        raise NotImplementedError

    def load_holdout(self, schema, path: Path) -> Holdout:
        raise NotImplementedError

    def probe(self, holdout: Holdout, schema, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(the export gates' probe inputs: `count` holdout items plus edge cases, the labels of its holdout part)."""
        raise NotImplementedError

    def fit_layout(self, inputs: np.ndarray, schema) -> Any:
        """The model's layout, fitted on the training split (its `to_dict()` is saved beside the weights)."""
        raise NotImplementedError

    def layout_from_dict(self, saved: dict) -> Any:
        raise NotImplementedError

    def large_from(self, params) -> tuple[int, str]:
        """(training rows from which `train.model: auto` trains the modality's `large` family, the setting that says
        so)."""
        return params.train.ft_min_rows, "train.ft_min_rows"

    def augmentation(self, params) -> Any:
        """The label-safe augmentation of training batches (its settings, part of the run's identity), or None."""
        return None

    def augmenter(self, settings, seed: int) -> Callable | None:
        """(batch, epoch, step) -> the batch augmented by `settings` (None: nothing to do). Picklable: DataLoader
        workers started by spawn receive it."""
        return None

    def student(self, distill) -> tuple[str, dict]:
        """(model name, its args) of the distilled student."""
        raise NotImplementedError

    def export_example(self, schema):
        """A small batch of the bare model's input (a torch tensor) to trace exports with."""
        raise NotImplementedError

    def traced(self, model, example) -> tuple[Any, list[str]]:
        """(the module the export stage traces, its output names): `logits`, and `embedding` where the monitor
        watches the model's own embedding."""
        return model, ["logits"]

    # -- the served graph -----------------------------------------------------------------------------------
    def compose(self, bare, schema):
        """The served graph: the bare ONNX model behind its raw inputs, with probabilities and the decision."""
        raise NotImplementedError

    def raw_parity(self, name: str, bare_session, served_session, schema, holdout: Holdout, rules,
                   graph: bytes | None = None):
        """The gate that the served graph (`served_session`, opened from `graph`, its serialised bytes) answers its
        raw inputs as the bare model answers its inputs."""
        raise NotImplementedError

    def feed(self, schema, inputs) -> Feed:
        """Raw inputs (as `Holdout.feed` or a frame of raw rows) -> the served graph's feed."""
        raise NotImplementedError

    def bare_inputs(self, schema, feed: Feed) -> np.ndarray:
        """A feed -> the bare model's input `x` (scoring a bare model: a variant, or an old version)."""
        raise NotImplementedError

    def signature(self, schema, graph: Path, holdout: Holdout) -> tuple[Any, Any]:
        """(an input example, the MLflow signature) the registered graph is logged with."""
        raise NotImplementedError

    def request_bodies(self, holdout: Holdout, schema, count: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
        """`count` one-item /predict bodies drawn from the holdout (cycled), and their holdout positions."""
        raise NotImplementedError

    def describe_inputs(self, prepared: dict) -> str:
        """What the model takes, for the model card (from prepare's metrics)."""
        raise NotImplementedError

    def input_signature(self, schema) -> list[tuple[str, str]]:
        """Names and kinds of the inputs: two models are comparable only when these match."""
        raise NotImplementedError

    # -- the monitor, ingest and the retrain ----------------------------------------------------------------
    def watched(self, schema):
        """The schema whose feature columns the column drift compares (the logged columns of a request)."""
        raise NotImplementedError

    def reference_frame(self, schema, session, rows: int, seed: int) -> pd.DataFrame:
        """Reference rows for the monitor, in the request log's columns, with the serving version's answers."""
        raise NotImplementedError

    def judge_batch(self, path: Path, params, schema) -> Labelled:
        """A labelled batch handed to `torchship ingest`, judged; refused items are already quarantined."""
        raise NotImplementedError

    def labelled_batch(self, params, schema, window, since: float, until: float) -> Labelled:
        """What a retrain learns from, labelled in (since, until]: the window's feedback-labelled rows, or the
        examples `torchship ingest` accepted."""
        raise NotImplementedError

    def labelled_times(self) -> list[float] | None:
        """When each labelled example a retrain could learn from arrived, where they are not the request log's
        feedback (None: the window's feedback labels are)."""
        return None
