"""What the monitor watches of served texts, since the request log keeps no text by default: each text's offline
descriptors (length, words, non-letter share, out-of-vocabulary share against the run's own tokenizer: compared column
by column, as a table's features are) and the model's own embedding projection (compared as one embedding:
tasks/monitoring/embeddings.py).

Reference and window hold the same columns: the validation split's descriptors beside the serving version's
embeddings and answers on those texts, and the served texts' logged descriptors beside the embeddings the served
graph gave."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.text.descriptors import DESCRIPTORS, model_descriptors
from tasks.modalities.text.inputs import schema_tokenizer


def descriptor_schema(schema: Schema) -> Schema:
    """The text model's schema as the column drift sees it: one numeric feature per logged descriptor."""
    return Schema(source=schema.source, target=schema.target, classes=schema.classes,
                  features=[Feature(name=name, kind="numeric") for name in DESCRIPTORS])


def reference_frame(schema: Schema, session, rows: int, seed: int) -> pd.DataFrame:
    """The validation split, not the training one (a network's embeddings of the texts it fit are not what it gives
    unseen texts): its descriptors, the serving version's embedding projection and its answers."""
    from tasks.core import paths
    from tasks.core.runtime import EMBEDDING, decide, decision_threshold
    from tasks.core.servelog import PREDICTION
    from tasks.modalities.text.graph import text_feed
    from tasks.modalities.text.shards import read_texts

    texts = read_texts(paths.VAL_SPLIT)
    picked = np.sort(np.random.default_rng(seed).permutation(len(texts))[:rows])
    chosen = [texts[i] for i in picked]
    probabilities, embedding = session.run(["probabilities", EMBEDDING], text_feed(chosen))
    decided = decide(probabilities, decision_threshold(session.get_modelmeta().custom_metadata_map))
    frame = model_descriptors(chosen, schema_tokenizer(schema))
    return frame.assign(**{EMBEDDING: list(embedding), PREDICTION: [schema.classes[i] for i in decided]})
