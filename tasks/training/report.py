"""What the train stage leaves behind: metrics, history, plots, and the MLflow run (rank 0 only)."""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.metrics import balances_classes, classification_metrics, confusion
from tasks.core.params_spec import Params, TrainParams
from tasks.core.plots import plot_confusion, plot_learning_curves, plot_roc_pr
from tasks.core.runtime import decide
from tasks.core.schema_spec import Schema
from tasks.training.adapt import FittedTraining
from tasks.training.crossval import cross_validation_headline
from tasks.training.decision import decision_headline
from tasks.training.distributed import describe_device
from tasks.training.loop import predict_logits
from tasks.training.timeline import Timeline

log = logging.getLogger("torchship.train")


def report_training(params: Params, model: nn.Module, val, history: list[dict], schema: Schema, runtime,
                    peak_rss_mb: float = 0.0, folder: Path = paths.TRAIN, stage: str = "train",
                    train_params: TrainParams | None = None, fitted: FittedTraining | None = None,
                    cross_validation: dict | None = None, calibration: dict | None = None,
                    decision: dict | None = None, logits: torch.Tensor | None = None,
                    peak_device_memory_mb: float | None = None, timeline: Timeline | None = None) -> dict:
    """Write metrics.json / history.csv / plots under `folder` and log them with the params to MLflow;
    `cross_validation` (tasks/training/crossval.py's summary) adds the out-of-fold scores, the family choice and
    their calibration; `calibration`, a single model's on its validation rows (tasks/training/calibration.py);
    `decision` (tasks/training/decision.py) a binary model's threshold, which the validation scores apply; `logits`,
    the model's on `val` where the caller has them already; `timeline` gets the report's own marks and goes into
    metrics.json (written last) as `timeline_s`."""
    from tasks.core.tracking import stage_run

    backend, world, strategy = runtime.backend, runtime.world, runtime.strategy
    train_params = train_params or params.train
    metrics_path, history_path, plots = folder / "metrics.json", folder / "history.csv", folder / "plots"
    logits = predict_logits(model, val.features) if logits is None else logits
    threshold = decision["threshold"] if decision else None
    predicted = decide(torch.softmax(logits, 1).numpy(), threshold)   # the labels the served graph answers
    calibration = calibration or (cross_validation or {}).get("calibration") or {}
    n_classes = len(schema.classes)
    scores = classification_metrics(val.labels.numpy(), predicted, n_classes)
    best = max(history, key=lambda r: r["val_f1_macro"])
    metrics = {"val_accuracy": scores["accuracy"], "val_f1_macro": scores["f1_macro"],
               "epochs_run": len(history), "best_epoch": best["epoch"],
               "samples_per_s": sum(r["samples_per_s"] for r in history) / len(history),
               "train_seconds": sum(r["seconds"] for r in history), "peak_rss_mb": round(peak_rss_mb, 1),
               "backend": backend, "world_size": world, "strategy": strategy,
               "device": str(runtime.device), "device_name": describe_device(runtime.device),
               "peak_device_memory_mb": None if peak_device_memory_mb is None else round(peak_device_memory_mb, 1),
               "precision": runtime.precision, "precision_note": runtime.precision_note, "notes": list(runtime.notes),
               "parameters": sum(p.numel() for p in model.parameters()),
               "class_weights": "balanced" if balances_classes(params.bless.metric) else "none",
               "temperature": calibration.get("temperature", 1.0), "threshold": threshold, "decision": decision,
               # cross-validated members trained on the validation rows too: their figure there is in sample
               "headline": f"val{' (in sample)' if cross_validation else ''} f1 {scores['f1_macro']:.4f}, "
                           f"acc {scores['accuracy']:.4f} "
                           f"({len(history)} epochs, {strategy} {world}x{backend}, {runtime.precision})"
                           + (f"; {cross_validation_headline(cross_validation)}" if cross_validation
                              else f"; {decision_headline(decision)}" if decision else "")
                           + (f"; temperature {calibration['temperature']:.3g} (validation ECE "
                              f"{calibration['ece_before']:.3f} -> {calibration['ece_after']:.3f})"
                              if calibration and not cross_validation and calibration["temperature"] != 1.0 else "")
                           + (f"; {fitted.headline()}" if fitted else "")}
    if fitted:
        metrics["fitted"] = fitted.model_dump()
    if cross_validation:
        metrics["cross_validation"] = cross_validation
    if calibration:
        metrics["calibration"] = calibration
    frame = pd.DataFrame(history)
    write_atomic(history_path, lambda tmp: frame.to_csv(tmp, index=False))
    plots.mkdir(parents=True, exist_ok=True)
    plot_learning_curves(frame, plots / "learning_curves.png")
    plot_confusion(confusion(val.labels.numpy(), predicted, n_classes), schema.classes,
                   plots / "confusion_matrix.png")
    if n_classes == 2:  # the minority class is the one people ask about (churn, fraud)
        positive = int(torch.bincount(val.labels, minlength=2).argmin())
        plot_roc_pr((val.labels.numpy() == positive).astype(int), torch.softmax(logits, 1)[:, positive].numpy(),
                    schema.classes[positive], plots / "roc_pr.png")
    timeline = timeline or Timeline()
    timeline.mark("plots")
    with stage_run(params.tracking, stage) as stage_log:
        stage_log.log_params({**train_params.model_dump(), "backend": backend, "world_size": world,
                              "strategy_used": strategy, "device_name": metrics["device_name"],
                              "precision_used": runtime.precision, "precision_note": runtime.precision_note,
                              "notes": "; ".join(runtime.notes)})
        for step, record in enumerate(history, start=1):   # = the epoch for one run; folds follow one another
            stage_log.log_metrics({k: v for k, v in record.items() if k != "epoch"}, step=step)
        stage_log.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        if decision:   # the threshold's evidence: the metric at 0.5 and at the threshold, on the rows it was fit on
            stage_log.log_metrics({f"decision_{k}": v for k, v in decision.items() if isinstance(v, (int, float))})
            stage_log.log_params({"decision_metric": decision["metric"], "decision_source": decision["source"]})
        if cross_validation:
            stage_log.log_params({"cv_members": cross_validation["folds"],
                                  "cv_chosen_model": cross_validation["chosen"]})
            stage_log.log_metrics({f"oof_{name}_{key}": value
                                   for name, scores in cross_validation["candidates"].items()
                                   for key, value in scores.items()})
            stage_log.log_metrics({f"oof_{key}": value for key, value in cross_validation["out_of_fold"].items()})
        if calibration:
            stage_log.log_metrics({f"calibration_{key}": value for key, value in calibration.items()})
        stage_log.log_artifacts(str(plots), artifact_path="plots")
        stage_log.log_artifact(str(history_path))
        if fitted:
            stage_log.log_dict(fitted.model_dump(), "fitted_training.json")
    timeline.mark("mlflow")
    metrics["timeline_s"] = timeline.seconds()
    write_json_atomic(metrics_path, metrics)
    return metrics


class TrainingProgress:
    """A rich progress bar on rank 0: epoch, step, loss, validation F1, samples/s."""

    def __init__(self, epochs: int, stage: str = "train"):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn(stage + " epoch {task.fields[epoch]}/" + str(epochs)), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[note]}"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=None, epoch=1, note="")
        self.bar.start()

    def step(self, epoch: int, step: int, steps: int) -> None:
        if step % 20 == 0 or step == steps - 1:
            self.bar.update(self.task, total=steps, completed=step + 1, epoch=epoch + 1)

    def epoch(self, record: dict) -> None:
        self.bar.update(self.task, note=f"loss {record['train_loss']:.4f}  val f1 {record['val_f1_macro']:.4f}  "
                                        f"{record['samples_per_s']:,.0f} samples/s")
        log.info("epoch %d: train loss %.4f, val loss %.4f, val acc %.4f, val f1 %.4f", record["epoch"],
                 record["train_loss"], record["val_loss"], record["val_accuracy"], record["val_f1_macro"])

    def close(self) -> None:
        self.bar.stop()
