"""distill: the student's torchrun job, run by the compress stage.

A small MLP learns from the teacher's soft targets (temperature, alpha in `distill`) through the training
engine's own worker, loop, checkpoints and report: `python -m tasks.training.distill` is what torchrun
starts in each process; `train_student` launches it.
"""
from __future__ import annotations

from tasks.core import paths
from tasks.core.artifacts import sha256_file
from tasks.core.metrics import balances_classes
from tasks.core.params_spec import Params, PretrainedParams, TrainParams
from tasks.core.schema_spec import load_schema
from tasks.modalities import fallback_modality, modality_of
from tasks.modalities.interface import Modality
from tasks.stages.entry import stage_main
from tasks.training.adapt import fit_training, fitted_settings
from tasks.training.distributed import device_kind
from tasks.training.job import TrainingJob, split_rows
from tasks.training.run import run_job
from tasks.training.weights import model_spec


def student_settings(params: Params, modality: Modality | None = None) -> TrainParams:
    """The teacher's engine settings (processes, strategy, precision, seed, `adapt`) with the student's model, the
    modality's (tables: a small MLP, images: a small ResNet); never from pretrained weights (the teacher's knowledge
    comes through its soft targets)."""
    student = params.distill
    model, args = (modality or fallback_modality()).student(student)
    return params.train.model_copy(update={
        "model": model, "model_args": {model: args}, "pretrained": PretrainedParams(),
        "epochs": student.epochs, "lr": student.lr,
        # One network, never cross-validated members: the student exists to be small and fast to serve, and its
        # soft targets already carry the (ensembled) teacher's averaging.
        "cv_max_rows": 0,
        "nnodes": 1})  # tiny: one node, even when the teacher used several


def student_job(params: Params) -> TrainingJob:
    """The student's job, its schedule fitted to the training split like the teacher's."""
    modality = modality_of(load_schema(paths.SCHEMA))
    fitted = fit_training(student_settings(params, modality), split_rows(paths.TRAIN_SPLIT), device_kind(), modality)
    settings = fitted_settings(student_settings(params, modality), fitted)
    return TrainingJob("distill", settings, model_spec(settings), paths.STUDENT_WEIGHTS, paths.STUDENT_CHECKPOINTS,
                       paths.STUDENT, paths.STUDENT_LOGS, module="tasks.training.distill",
                       identity=(sha256_file(paths.MODEL_WEIGHTS), params.distill.model_dump_json()),
                       soft_targets=(params.distill.temperature, params.distill.alpha), teacher=paths.MODEL_WEIGHTS,
                       fitted=fitted, balanced=balances_classes(params.bless.metric),
                       augment=modality.augmentation(params), modality=modality.name)


def train_student(params: Params) -> None:
    """Train the student (writes data/compress/student/): in this process when it is one rank, else under
    torchrun, as the teacher is."""
    run_job(params, student_job(params))


if __name__ == "__main__":
    stage_main("distill", lambda params: run_job(params, student_job(params)))
