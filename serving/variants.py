"""The variants a service answers with: a registered model version loaded for serving (ONNX Runtime
session, the schema it carries, its request row type), and the router that picks one per request."""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pydantic import BaseModel

from serving.validation import row_model
from tasks.contract import Schema
from tasks.core.registry import open_version
from tasks.core.runtime import predict_proba

log = logging.getLogger("torchship.serving")


class NoChampion(LookupError):
    """No champion is loaded yet (nothing registered, or the registry was unreachable at start)."""


@dataclass(frozen=True)
class Variant:
    alias: str
    version: str
    schema: Schema
    session: "object"
    row_type: type[BaseModel]   # request rows are validated against this version's own schema

    def predict(self, rows: pd.DataFrame) -> tuple[list[str], np.ndarray]:
        """Raw rows -> (labels, class probabilities (N, C))."""
        probabilities = predict_proba(self.session, self.schema, rows)
        return [self.schema.classes[i] for i in probabilities.argmax(1)], probabilities


def load_variant(client, model_name: str, alias: str, version: str, threads: int) -> Variant:
    """Download and open one registered version."""
    session, schema = open_version(client, model_name, version, threads)
    log.info("loaded %s v%s", alias, version)
    return Variant(alias=alias, version=str(version), schema=schema, session=session, row_type=row_model(schema))


@dataclass
class Router:
    """Holds the live variants; swapping a reference is atomic, so requests never see a half-loaded model."""

    champion: Variant | None = None
    challenger: Variant | None = None
    share: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def pick(self) -> Variant:
        """The challenger for `share` of requests (when one is loaded), else the champion."""
        if self.challenger is not None and self.rng.random() < self.share:
            return self.challenger
        if self.champion is None:
            raise NoChampion("no champion model is loaded yet: register one (torchship run) and retry")
        return self.champion

    def other(self, variant: Variant) -> Variant | None:
        """The variant not answering this request (for shadow scoring), if both are loaded."""
        if self.challenger is None or self.champion is None:
            return None
        return self.challenger if variant is self.champion else self.champion
