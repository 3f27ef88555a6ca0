"""train: fit the teacher under torchrun (DDP or FSDP2; gloo on CPU, nccl on CUDA), resumable.

DVC stage: `python -m tasks.train` relaunches itself under `torchrun` with train.nproc processes per
node (one process on one node without restarts trains in the stage's own process); each worker resumes from the
newest intact checkpoint of the same run (params + data), so a killed job re-run, or a worker restarted by
`torchrun --max_restarts`, continues where it stopped.
"""
from __future__ import annotations

from tasks.core import paths
from tasks.core.metrics import balances_classes
from tasks.core.params_spec import Params
from tasks.core.schema_spec import load_schema
from tasks.modalities import modality_of
from tasks.stages.entry import stage_main
from tasks.training.adapt import fit_training, fitted_settings
from tasks.training.distributed import device_kind
from tasks.training.job import TrainingJob, split_rows
from tasks.training.run import run_job
from tasks.training.weights import model_spec


def teacher_job(params: Params) -> TrainingJob:
    """The teacher's job with its settings fitted to the training split and the device (model `auto`, batch, epochs,
    lr)."""
    modality = modality_of(load_schema(paths.SCHEMA))
    fitted = fit_training(params.train, split_rows(paths.TRAIN_SPLIT), device_kind(), modality,
                          modality.large_from(params))
    settings = fitted_settings(params.train, fitted)
    return TrainingJob("train", settings, model_spec(settings), paths.MODEL_WEIGHTS, paths.CHECKPOINTS,
                       paths.TRAIN, paths.TRAIN_LOGS, fitted=fitted, balanced=balances_classes(params.bless.metric),
                       augment=modality.augmentation(params), modality=modality.name,
                       pretrained=params.train.pretrained if params.train.pretrained.path else None)


def run(params: Params) -> None:
    run_job(params, teacher_job(params))


if __name__ == "__main__":
    stage_main("train", run)
