"""What the train stage leaves behind: metrics, history, plots, and the MLflow run (rank 0 only)."""
from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from tasks import layout
from tasks.artifacts import write_atomic, write_json_atomic
from tasks.config import Params
from tasks.contract import Schema
from tasks.metrics import classification_metrics, confusion
from tasks.plots import plot_confusion, plot_learning_curves


def report_training(params: Params, model: nn.Module, val, history: list[dict], schema: Schema,
                    backend: str, world: int) -> dict:
    """Write metrics.json / history.csv / plots and log them with the params to MLflow."""
    import mlflow

    from tasks.tracking import stage_run

    model.eval()
    with torch.no_grad():
        predicted = model(val.features).argmax(1).numpy()
    n_classes = len(schema.classes)
    scores = classification_metrics(val.labels.numpy(), predicted, n_classes)
    best = max(history, key=lambda r: r["val_f1_macro"])
    metrics = {"val_accuracy": scores["accuracy"], "val_f1_macro": scores["f1_macro"],
               "epochs_run": len(history), "best_epoch": best["epoch"],
               "samples_per_s": sum(r["samples_per_s"] for r in history) / len(history),
               "backend": backend, "world_size": world,
               "parameters": sum(p.numel() for p in model.parameters()),
               "headline": f"val f1 {scores['f1_macro']:.4f}, acc {scores['accuracy']:.4f} "
                           f"({len(history)} epochs, {world}x{backend})"}
    write_json_atomic(layout.TRAIN_METRICS, metrics)
    frame = pd.DataFrame(history)
    write_atomic(layout.TRAIN_HISTORY, lambda tmp: frame.to_csv(tmp, index=False))
    layout.TRAIN_PLOTS.mkdir(parents=True, exist_ok=True)
    plot_learning_curves(frame, layout.TRAIN_PLOTS / "learning_curves.png")
    plot_confusion(confusion(val.labels.numpy(), predicted, n_classes), schema.classes,
                   layout.TRAIN_PLOTS / "confusion_matrix.png")
    with stage_run(params.tracking, "train"):
        mlflow.log_params({**params.train.model_dump(), "backend": backend, "world_size": world})
        for record in history:
            mlflow.log_metrics({k: v for k, v in record.items() if k != "epoch"}, step=record["epoch"])
        mlflow.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        mlflow.log_artifacts(str(layout.TRAIN_PLOTS), artifact_path="plots")
        mlflow.log_artifact(str(layout.TRAIN_HISTORY))
    return metrics
