"""What the monitor compares of served rows: the features themselves, column by column, against a seeded sample of
the training split with the serving version's answers on it."""
from __future__ import annotations

import pandas as pd

from tasks.core import paths
from tasks.core.schema_spec import Schema
from tasks.core.servelog import PREDICTION
from tasks.modalities.scoring import served_classes


def reference_frame(schema: Schema, session, rows: int, seed: int) -> pd.DataFrame:
    """A seeded sample of the training split, with the serving version's answers on it."""
    train = pd.read_parquet(paths.TRAIN_SPLIT)
    train = train.sample(n=min(rows, len(train)), random_state=seed) if len(train) > rows else train
    _, decided = served_classes(session, schema, train)
    return train.assign(**{PREDICTION: [schema.classes[i] for i in decided]})
