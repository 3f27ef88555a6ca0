"""Plots people would rather look at than read; PNGs logged to MLflow."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.artifacts import write_atomic


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(history: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, (loss_ax, score_ax) = plt.subplots(1, 2, figsize=(10, 4))
    loss_ax.plot(history["epoch"], history["train_loss"], marker="o", label="train")
    loss_ax.plot(history["epoch"], history["val_loss"], marker="o", label="validation")
    loss_ax.set(title="Loss", xlabel="epoch")
    loss_ax.legend()
    score_ax.plot(history["epoch"], history["val_accuracy"], marker="o", label="accuracy")
    score_ax.plot(history["epoch"], history["val_f1_macro"], marker="o", label="macro F1")
    score_ax.set(title="Validation", xlabel="epoch")
    score_ax.legend()
    fig.tight_layout()
    save_figure(plt, fig, path)


def plot_confusion(matrix: np.ndarray, classes: list[str], path: Path) -> None:
    plt = pyplot()
    size = min(12, 3 + 0.5 * len(classes))
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(len(classes)), yticks=range(len(classes)), xticklabels=classes, yticklabels=classes,
           xlabel="predicted", ylabel="true", title="Confusion matrix (validation)")
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center",
                color="white" if count > matrix.max() / 2 else "black", fontsize=8)
    fig.tight_layout()
    save_figure(plt, fig, path)


def plot_roc_pr(labels: np.ndarray, scores: np.ndarray, positive: str, path: Path) -> None:
    """ROC and precision-recall curves of a binary classifier (positive class = `positive`)."""
    from sklearn.metrics import auc, precision_recall_curve, roc_curve

    plt = pyplot()
    fpr, tpr, _ = roc_curve(labels, scores)
    precision, recall, _ = precision_recall_curve(labels, scores)
    fig, (roc_ax, pr_ax) = plt.subplots(1, 2, figsize=(10, 4))
    roc_ax.plot(fpr, tpr, label=f"AUC {auc(fpr, tpr):.3f}")
    roc_ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    roc_ax.set(title=f"ROC (positive: {positive})", xlabel="false positive rate", ylabel="true positive rate")
    roc_ax.legend()
    pr_ax.plot(recall, precision, label=f"AUC {auc(recall, precision):.3f}")
    pr_ax.axhline(labels.mean(), linestyle="--", color="grey", label="base rate")
    pr_ax.set(title="Precision-recall", xlabel="recall", ylabel="precision")
    pr_ax.legend()
    fig.tight_layout()
    save_figure(plt, fig, path)


def plot_latency(latencies_us: dict[str, np.ndarray], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, values in latencies_us.items():
        ax.hist(values, bins=60, alpha=0.55, label=f"{name} (p50 {np.percentile(values, 50):.0f} µs)",
                range=(0, float(np.percentile(np.concatenate(list(latencies_us.values())), 99))))
    ax.set(title="Batch-1 latency per variant", xlabel="µs per call", ylabel="calls")
    ax.legend()
    fig.tight_layout()
    save_figure(plt, fig, path)


def save_figure(plt, fig, path: Path) -> None:
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
