"""What the monitor watches of served images, since the request log keeps no pixels: each image's statistics
(compared column by column, as a table's features are) and the model's own embedding projection (compared as one
embedding: tasks/monitoring/embeddings.py).

Reference and window hold the same columns: the training split's metadata (written by prepare) beside the serving
version's embeddings of those images, and the served rows' logged statistics beside the embeddings the served graph
gave."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.image.contract import image_shape

STATISTICS = ("width", "height", "file_bytes", "brightness", "contrast")


def statistics_schema(schema: Schema) -> Schema:
    """The image model's schema as the column drift sees it: one numeric feature per logged statistic."""
    return Schema(source=schema.source, target=schema.target, classes=schema.classes,
                  features=[Feature(name=name, kind="numeric") for name in STATISTICS])


def reference_frame(schema: Schema, session, rows: int, seed: int) -> pd.DataFrame:
    """The validation split, not the training one: a network's embeddings and answers on the images it fit are not
    what it gives unseen images of the same distribution (clean traffic would look drifted). Its statistics (what
    the request log keeps of an image), the serving version's embedding projection and its answers."""
    from tasks.core import paths
    from tasks.core.runtime import EMBEDDING, decide, decision_threshold
    from tasks.core.servelog import PREDICTION
    from tasks.modalities.image.graph import INPUT
    from tasks.modalities.image.shards import read_metadata, read_pixels

    metadata = read_metadata(paths.VAL_SPLIT, schema.target)
    picked = np.sort(np.random.default_rng(seed).permutation(len(metadata))[:rows])
    pixels = read_pixels(paths.VAL_SPLIT, image_shape(schema).shape)[picked]
    probabilities, embedding = session.run(["probabilities", EMBEDDING], {INPUT: pixels})
    decided = decide(probabilities, decision_threshold(session.get_modelmeta().custom_metadata_map))
    frame = metadata.iloc[picked][list(STATISTICS)].reset_index(drop=True)
    return frame.assign(**{EMBEDDING: list(embedding), PREDICTION: [schema.classes[i] for i in decided]})
