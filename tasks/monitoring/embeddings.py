"""Drift of the model's own embedding projection, which a served graph outputs beside its probabilities (images,
texts: the request log keeps it instead of the raw input): compared as one embedding with Evidently's embedding
drift, a classifier told to tell reference from window, its ROC AUC tested against chance by bootstrap."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.runtime import EMBEDDING

EMBEDDING_METHOD = "embeddings: classifier ROC AUC vs chance (Evidently, bootstrap 99%)"


def embedding_columns(k: int) -> list[str]:
    return [f"{EMBEDDING}_{i}" for i in range(k)]


def spread_embeddings(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame whose `embedding` column holds lists -> one numeric column per dimension (what Evidently takes)."""
    vectors = np.array([np.asarray(v, dtype=np.float64) for v in frame[EMBEDDING]])
    columns = pd.DataFrame(vectors, columns=embedding_columns(vectors.shape[1]), index=frame.index)
    return pd.concat([frame.drop(columns=[EMBEDDING]), columns], axis=1)


def embedding_drift(reference: pd.DataFrame, current: pd.DataFrame, seed: int = 0) -> tuple[float, float, bool]:
    """(ROC AUC, the chance level it must beat, drifted) of Evidently's model-based embedding drift on the
    `embedding_*` columns of two samples."""
    from evidently.legacy.metrics.data_drift.embedding_drift_methods import ModelDriftMethod

    columns = [c for c in reference.columns if c.startswith(f"{EMBEDDING}_")]
    np.random.seed(seed)   # the bootstrap of chance draws from numpy's global generator
    method = ModelDriftMethod(bootstrap=True, quantile_probability=0.99)   # 1 clean window in 100 called drifted
    score, drifted, _ = method(current[columns].reset_index(drop=True), reference[columns].reset_index(drop=True))
    return float(score), 0.5, bool(drifted)


def embeddings_report(reference: pd.DataFrame, current: pd.DataFrame):
    """Evidently's EmbeddingsDrift metric over the two samples, for the HTML report."""
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import EmbeddingsDrift

    columns = [c for c in reference.columns if c.startswith(f"{EMBEDDING}_")]
    definition = DataDefinition(numerical_columns=columns, embeddings={EMBEDDING: columns})
    return Report([EmbeddingsDrift(embeddings_name=EMBEDDING)]).run(
        reference_data=Dataset.from_pandas(reference[columns], data_definition=definition),
        current_data=Dataset.from_pandas(current[columns], data_definition=definition))
