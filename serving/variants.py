"""The variants a service answers with: a registered model version loaded for serving (ONNX Runtime
session, the schema it carries, its request decoder), and the router that picks one per request."""
from __future__ import annotations

import hashlib
import logging
import mmap
import os
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.core.runtime import EMBEDDING, decide, decision_threshold, open_onnx, softmax, takes_raw_rows
from tasks.core.schema_spec import Schema, schema_from_metadata
from tasks.modalities import modality_of, serving_part

log = logging.getLogger("torchship.serving")


class NoChampion(LookupError):
    """No champion is loaded yet (nothing registered, or the registry was unreachable at start)."""


@dataclass(frozen=True)
class Variant:
    alias: str
    version: str
    schema: Schema
    session: object
    decoder: object       # its modality's request decoder: bodies are parsed and checked by this version's own schema
    raw: bool = True      # a served graph on raw inputs; False: a bare model on the encoded input (old table versions)
    run: Callable = None  # (output names, feed) -> outputs: see graph_runner
    threshold: float | None = None   # a binary graph's decision threshold (its metadata); None: the argmax
    outputs: tuple[str, ...] = ("probabilities",)   # and the embedding projection, where the graph gives one

    def score(self, items) -> np.ndarray:
        """Accepted items -> scores (N, C [+ k]), float32: the class probabilities, and where the graph gives one the
        embedding projection after them (what the request log keeps instead of raw inputs: `split`)."""
        if not self.raw:   # a version registered before the graph took raw inputs
            return softmax(self.session.run(None, {"x": self.decoder.bare_inputs(items)})[0])
        scores = self.run(list(self.outputs), self.decoder.feed(items))
        return scores[0] if len(scores) == 1 else np.concatenate(scores, axis=1)

    def split(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(probabilities (N, C), the embedding projection (N, k) or None) of `score`'s answer."""
        classes = len(self.schema.classes)
        return scores[:, :classes], (scores[:, classes:] if scores.shape[1] > classes else None)

    def labels(self, probabilities: np.ndarray) -> np.ndarray:
        """The class indices this version serves for its probabilities: the rule its graph's `decision` output
        applies (tasks.core.runtime.decide), so the service answers what the graph itself, `torchship predict` and
        `mlflow models serve` answer."""
        return decide(probabilities, self.threshold)

    def warm(self) -> None:
        """One prediction on a blank item (ONNX Runtime allocates on its first run): the first request does not pay
        for it, and a graph that cannot score is refused before it serves."""
        inputs = {i.name for i in self.session.get_inputs()}
        if self.raw and inputs != self.decoder.inputs():   # the feed names every input, and only those
            raise ValueError(f"the graph's inputs {sorted(inputs)} are not its request's "
                             f"{sorted(self.decoder.inputs())}")
        probabilities = self.split(self.score(self.decoder.blank()))[0]
        if probabilities.shape != (1, len(self.schema.classes)):
            raise ValueError(f"the graph answers {probabilities.shape} probabilities for one row, not "
                             f"(1, {len(self.schema.classes)}) (its classes)")


def graph_runner(session) -> Callable:
    """The session's run without its Python-side feed check: InferenceSession.run first loops over every graph
    input in Python (~30 µs a call for a 64-column graph, a quarter of a request's time in the service). The feed
    is built from the schema the graph carries, and the warm-up proves it complete; a missing input would still
    fail cleanly in ONNX Runtime itself."""
    inner = getattr(session, "_sess", None)
    if inner is None:   # another ONNX Runtime layout: the public call
        return session.run
    return lambda outputs, feed: inner.run(outputs, feed, None)


def decoder_for(schema: Schema, host: dict | None = None):
    """The request decoder of a model's modality (its serving part), by the model's own schema and limits; `host`:
    this serving host's modality sections (`images`, ...), which may only tighten what the model was trained under."""
    modality = modality_of(schema)
    section = (host or {}).get(modality.section) if modality.section else None
    if isinstance(section, dict):   # as the service's settings carry it to its workers
        section = modality.settings.model_validate(section)
    return serving_part(modality.name).decoder(schema, section)


def make_variant(alias: str, version: str, session, schema: Schema, host: dict | None = None) -> Variant:
    """A warmed variant of an opened graph."""
    outputs = ("probabilities", EMBEDDING) if EMBEDDING in {o.name for o in session.get_outputs()} else \
        ("probabilities",)
    variant = Variant(alias=alias, version=str(version), schema=schema, session=session,
                      decoder=decoder_for(schema, host), raw=takes_raw_rows(session), run=graph_runner(session),
                      threshold=decision_threshold(session.get_modelmeta().custom_metadata_map), outputs=outputs)
    variant.warm()
    return variant


def bytes_variant(alias: str, version: str, payload: bytes, threads: int, host: dict | None = None) -> Variant:
    """A registered version from its (verified) ONNX bytes, opened and warmed."""
    session = open_onnx(payload, threads)
    variant = make_variant(alias, version, session, schema_from_metadata(session.get_modelmeta().custom_metadata_map),
                           host)
    log.info("loaded %s v%s", alias, version)
    return variant


def file_variant(alias: str, path: Path, threads: int, host: dict | None = None) -> Variant:
    """A local ONNX file (exported by torchship: it carries its schema) as version `file`."""
    session = open_onnx(path, threads)
    variant = make_variant(alias, "file", session, schema_from_metadata(session.get_modelmeta().custom_metadata_map),
                           host)
    log.info("serving %s", path)
    return variant


class SharedShare:
    """The challenger share and the shadow switch as 16 bytes of a file that every worker process maps
    (serve.workers > 1): /admin/share answered by one worker moves the split of all of them. An aligned 8-byte
    store is atomic: a reader sees the old value or the new one."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 16)
        finally:
            os.close(fd)

    @staticmethod
    def create(path: Path, share: float) -> Path:
        path.write_bytes(struct.pack("dd", share, 0.0))
        return path

    def get(self) -> float:
        return struct.unpack_from("d", self._map)[0]

    def set(self, share: float) -> None:
        struct.pack_into("d", self._map, 0, share)

    def get_shadow(self) -> bool:
        return struct.unpack_from("d", self._map, 8)[0] > 0

    def set_shadow(self, shadow: bool) -> None:
        struct.pack_into("d", self._map, 8, 1.0 if shadow else 0.0)


def sticky_bucket(key: bytes) -> float:
    """A request key's place in [0, 1): a key whose bucket is under the share goes to the challenger, so as the
    share grows a key already on the challenger stays there (and a key never flips back and forth)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2.0 ** 64


class Router:
    """Holds the live variants; swapping a reference is atomic, so requests never see a half-loaded model."""

    def __init__(self, share: float = 0.0, rng: random.Random | None = None, shared: SharedShare | None = None):
        self.champion: Variant | None = None
        self.challenger: Variant | None = None
        self.rng = rng or random.Random()
        self._shared = shared
        self._share = share
        self._shadow = False

    @property
    def share(self) -> float:
        """The share of requests routed to the challenger (the workers' common one, when they share it)."""
        return self._shared.get() if self._shared is not None else self._share

    @share.setter
    def share(self, share: float) -> None:
        if self._shared is not None:
            self._shared.set(share)
        self._share = share

    @property
    def shadow(self) -> bool:
        """Whether the variant not answering also scores each request (logged, never returned): the canary."""
        return self._shared.get_shadow() if self._shared is not None else self._shadow

    @shadow.setter
    def shadow(self, shadow: bool) -> None:
        if self._shared is not None:
            self._shared.set_shadow(shadow)
        self._shadow = shadow

    def pick(self, key: bytes | None = None) -> Variant:
        """The challenger for `share` of requests (when one is loaded), else the champion. With a request key the
        choice is sticky (sticky_bucket); without one it is random."""
        if self.challenger is not None:
            share = self.share
            if share > 0.0 and (sticky_bucket(key) if key else self.rng.random()) < share:
                return self.challenger
        if self.champion is None:
            raise NoChampion("no champion model is loaded yet: register one (torchship run) and retry")
        return self.champion

    def other(self, variant: Variant) -> Variant | None:
        """The variant not answering this request (for shadow scoring), if both are loaded."""
        if self.challenger is None or self.champion is None:
            return None
        return self.challenger if variant is self.champion else self.champion
