"""baseline: what a few lines of scikit-learn reach on the same splits, so a candidate that is worse than a
trivial model is never blessed. Each modality fits its own (tables: logistic regression and gradient boosting;
images: the majority class and a regression on downsampled pixels), and with `train.pretrained` a linear probe on
the frozen backbone's features joins them as the gate's baseline. The gate's baseline's holdout predictions are
saved beside the report, so bless can bootstrap the gap on the same rows. DVC stage `python -m tasks.baseline`: it
depends only on the splits and params, so DVC caches it."""
from __future__ import annotations

import logging
from functools import partial

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.params_spec import Params
from tasks.core.schema_spec import load_schema
from tasks.modalities import modality_of
from tasks.stages.entry import stage_main

log = logging.getLogger("torchship.baseline")


def run(params: Params) -> None:
    from tasks.core.tracking import stage_run

    schema = load_schema(paths.SCHEMA)
    backbone = None
    if params.train.pretrained.path:   # a linear probe on the frozen backbone's features joins the baselines
        from tasks.training.backbone import probe_features

        backbone = partial(probe_features, params, schema)
    report, gate_predictions = modality_of(schema).baselines(params, schema, backbone)
    models = report["models"]
    write_json_atomic(paths.BASELINE_PREDICTIONS, gate_predictions)
    write_json_atomic(paths.BASELINE_REPORT, report)
    with stage_run(params.tracking, "baseline") as stage_log:
        stage_log.log_metrics({f"{name}_{key}": value for name, figures in models.items()
                               for key, value in figures.items()})
        stage_log.log_dict(report, "baseline.json")
    log.info("baselines on the holdout: %s", report["headline"])


if __name__ == "__main__":
    stage_main("baseline", run)
