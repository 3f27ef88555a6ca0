"""prepare: read the source, judge it, split it stratified, write the splits and the schema fitted on the training
split, by the source's modality (tasks/modalities/: a table is parsed strictly, images are judged file by file).

DVC stage: `python -m tasks.prepare`.
"""
from __future__ import annotations

import logging

from tasks.core import paths
from tasks.core.params_spec import Params
from tasks.modalities import detect_modality
from tasks.modalities.sources import resolve_target
from tasks.stages.entry import stage_main

log = logging.getLogger("torchship.prepare")


def run(params: Params) -> None:
    """DVC stage body: prepare by the modality, log, say what was prepared."""
    from tasks.core.tracking import stage_run

    modality = detect_modality(params.data, params)
    target = resolve_target(params)
    metrics = modality.prepare(params, target)
    with stage_run(params.tracking, "prepare") as stage_log:
        stage_log.log_params({"source": params.data.source, "target": target, "modality": modality.name,
                              **params.prepare.model_dump()})
        stage_log.log_metrics({"rows_train": metrics["rows"]["train"], "classes": metrics["classes"],
                               **({"refused": metrics["refused"]} if "refused" in metrics else {})})
        stage_log.log_artifact(str(paths.SCHEMA))
    log.info("prepared %s", metrics["headline"])


if __name__ == "__main__":
    stage_main("prepare", run)
