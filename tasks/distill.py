"""distill: the student's torchrun job, run by the compress stage.

A small MLP learns from the teacher's soft targets (temperature, alpha in `distill`) through the train
stage's own worker, loop, checkpoints and report: `python -m tasks.distill` is what torchrun starts in
each process; `train_student` launches it.
"""
from __future__ import annotations

import os

from tasks import layout
from tasks.artifacts import sha256_file
from tasks.config import Params, TrainParams
from tasks.train import TrainingJob, launch, model_spec, worker


def student_settings(params: Params) -> TrainParams:
    """The teacher's engine settings (processes, strategy, precision, seed) with the student's model."""
    student = params.distill
    return params.train.model_copy(update={"model": "mlp", "model_args": {}, "hidden": list(student.hidden),
                                            "embedding_dim": student.embedding_dim, "dropout": 0.0,
                                            "epochs": student.epochs, "lr": student.lr,
                                            "nnodes": 1})  # tiny: one node, even when the teacher used several


def student_job(params: Params) -> TrainingJob:
    settings = student_settings(params)
    return TrainingJob("distill", settings, model_spec(settings), layout.STUDENT_WEIGHTS, layout.STUDENT_CHECKPOINTS,
                       layout.STUDENT, layout.STUDENT_LOGS, module="tasks.distill",
                       identity=(sha256_file(layout.MODEL_WEIGHTS), params.distill.model_dump_json()),
                       soft_targets=(params.distill.temperature, params.distill.alpha), teacher=layout.MODEL_WEIGHTS)


def train_student(params: Params) -> None:
    """Train the student under torchrun (writes data/compress/student/)."""
    launch(student_job(params))


def run(params: Params) -> None:
    if "LOCAL_RANK" not in os.environ:
        train_student(params)
    else:
        worker(params, student_job(params))


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("distill", run)
