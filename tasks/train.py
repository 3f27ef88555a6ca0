"""train: fit the classifier under torchrun (DDP or FSDP2; gloo on CPU, nccl on CUDA), resumable.

DVC stage: `python -m tasks.train` relaunches itself under `torchrun` with train.nproc processes per
node; each worker resumes from the newest intact checkpoint of the same run (params + data), so a
killed job re-run, or a worker restarted by `torchrun --max_restarts`, continues where it stopped.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from models import FeatureLayout, build_model
from tasks import checkpoint, layout
from tasks.artifacts import sha256_file, write_atomic
from tasks.config import Params, TrainParams
from tasks.contract import Schema, encode_features, encode_target, load_schema
from tasks.distributed import full_state, init_runtime, load_full_state, torchrun_command, wrap_model
from tasks.errors import TorchshipError
from tasks.train_loop import LoopState, Split, fit

log = logging.getLogger("torchship.train")


def fit_layout(features: np.ndarray, schema: Schema) -> FeatureLayout:
    """Numeric mean/std and category counts from the training split only."""
    numeric = [j for j, f in enumerate(schema.features) if f.kind == "numeric"]
    categorical = [j for j, f in enumerate(schema.features) if f.kind == "categorical"]
    values = features[:, numeric].astype(np.float64)
    mean = np.nan_to_num(np.nanmean(values, axis=0)) if numeric else np.zeros(0)
    std = np.nan_to_num(np.nanstd(values, axis=0), nan=1.0) if numeric else np.zeros(0)
    std = np.where(std < 1e-8, 1.0, std)
    return FeatureLayout(numeric_index=numeric, categorical_index=categorical,
                         cardinalities=[len(schema.features[j].categories) for j in categorical],
                         numeric_mean=[float(v) for v in mean], numeric_std=[float(v) for v in std],
                         n_classes=len(schema.classes))


def model_spec(params: TrainParams) -> dict:
    """Constructor arguments saved beside the weights so export can rebuild the model."""
    return {"name": params.model, "kwargs": {"hidden": list(params.hidden), "embedding_dim": params.embedding_dim,
                                             "dropout": params.dropout}}


def run_fingerprint(params: TrainParams) -> str:
    """Checkpoints resume only a run with the same training params and the same data."""
    relevant = params.model_dump(exclude={"checkpoint_every", "max_restarts", "collective_timeout_s", "threads"})
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode())
    for path in (layout.TRAIN_SPLIT, layout.VAL_SPLIT, layout.SCHEMA):
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()[:16]


def load_split(path, schema: Schema, device: torch.device) -> Split:
    frame = pd.read_parquet(path)
    return Split(torch.from_numpy(encode_features(frame, schema)).to(device),
                 torch.from_numpy(encode_target(frame[schema.target], schema)).to(device))


def threads_per_process(params: TrainParams) -> int:
    return params.threads or max(1, (os.cpu_count() or 1) // params.nproc)


def launch(params: Params) -> None:
    """Re-run this module under torchrun; a worker's own error message is what the user sees."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(params.train)), "PYTHONUNBUFFERED": "1"}
    code = subprocess.call(torchrun_command(params.train), env=env)
    if code != 0:
        raise TorchshipError(f"torchrun exited with code {code}: a training process failed (its message and "
                             "torchrun's summary naming the rank are above). Re-run to resume from the last checkpoint.")


def worker(params: Params) -> None:
    """One torchrun process: join the group, resume or start, train, and (rank 0) write and log."""
    from tasks.train_report import TrainingProgress, report_training

    runtime = init_runtime(params.train)
    try:
        torch.manual_seed(params.train.seed)
        torch.set_num_threads(threads_per_process(params.train))
        if runtime.rank == 0 and runtime.precision_note:
            log.warning("precision: %s", runtime.precision_note)
        schema = load_schema(layout.SCHEMA)
        train = load_split(layout.TRAIN_SPLIT, schema, runtime.device)
        val = load_split(layout.VAL_SPLIT, schema, runtime.device)
        feature_layout = fit_layout(train.features.cpu().numpy(), schema)
        spec = model_spec(params.train)
        model = wrap_model(build_model(spec["name"], feature_layout, **spec["kwargs"]), params.train.strategy, runtime)
        if params.train.compile:
            model = torch.compile(model)
        fingerprint = run_fingerprint(params.train)
        resume = checkpoint.load_latest(layout.CHECKPOINTS, fingerprint)
        if resume is None and runtime.rank == 0:
            checkpoint.clear(layout.CHECKPOINTS)
        dist.barrier()

        def save(state: LoopState, optimizer, extras) -> None:
            model_state, optimizer_state = full_state(model, optimizer)  # collective: all ranks
            if runtime.rank == 0:
                scheduler, scaler = extras
                checkpoint.save_checkpoint(layout.CHECKPOINTS, state.global_step, {
                    "loop": asdict(state), "model": model_state, "optimizer": optimizer_state,
                    "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                    "rng": torch.get_rng_state()}, fingerprint)

        progress = TrainingProgress(params.train.epochs) if runtime.rank == 0 else None
        state = fit(model, train, val, params.train, len(schema.classes), runtime.rank, runtime.world,
                    runtime.precision, resume=_resume_hooks(resume), save=save,
                    on_step=progress.step if progress else None, on_epoch=progress.epoch if progress else None,
                    full_state=lambda m: full_state(m)[0])
        if progress:
            progress.close()
        if runtime.rank == 0:
            best = build_model(spec["name"], feature_layout, **spec["kwargs"])
            best.load_state_dict(state.best_state)
            saved = {"state_dict": best.state_dict(), "layout": feature_layout.to_dict(), "model": spec,
                     "classes": list(schema.classes)}
            write_atomic(layout.MODEL_WEIGHTS, lambda tmp: torch.save(saved, tmp))
            report_training(params, best.eval(), Split(val.features.cpu(), val.labels.cpu()), state.history, schema,
                            runtime)
    finally:
        dist.destroy_process_group()


def _resume_hooks(saved: dict | None) -> dict | None:
    if saved is None:
        return None
    return {"loop": LoopState(**saved["loop"]), "scheduler": saved["scheduler"], "scaler": saved["scaler"],
            "rng": saved["rng"],
            "restore": lambda model, optimizer: load_full_state(model, optimizer, saved["model"], saved["optimizer"])}


def run(params: Params) -> None:
    if "LOCAL_RANK" in os.environ:
        worker(params)
    else:
        launch(params)


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("train", run)
