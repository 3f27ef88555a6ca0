"""What to change when the candidate trails the scikit-learn baselines: the one knob most likely to close the gap,
read from how the train stage ran (its metrics.json) and which baseline leads. Pure: dicts in, a phrase out."""
from __future__ import annotations

# Up to here a table is small enough that cross-validated members pay for their k-fold training time.
CV_WORTH_ROWS = 20_000


def linear_leads(baselines: dict[str, dict[str, float]], metric: str) -> bool:
    """Whether the best logistic regression scores at least the best gradient boosting (a tie counts: a table a
    linear model fits perfectly is linear enough)."""
    def best(family: str) -> float:
        return max((b[metric] for name, b in baselines.items() if name.startswith(family)), default=-1.0)

    return best("logistic_regression") >= best("hist_gradient_boosting")


def gap_advice(training: dict | None, baselines: dict[str, dict[str, float]], metric: str,
               max_baseline_gap: float) -> str:
    """The knob, and why, for a candidate behind the best of `baselines` on `metric`. `training`: the train
    stage's metrics.json with `cv_max_rows` (train.cv_max_rows) and, with pretrained weights, `pretrained_freeze`
    (train.pretrained.freeze) added; None when unknown."""
    training = training or {}
    fitted = training.get("fitted") or {}
    if any(name.startswith(("logistic_regression_pixels", "linear_probe")) for name in baselines):
        return image_advice(training, baselines, metric, max_baseline_gap)
    rows, folds, model = fitted.get("train_rows", 0), fitted.get("folds", 1), fitted.get("model", "")
    now = f"auto picked {model} out of fold" if len(fitted.get("candidates") or {}) > 1 else f"now {model}"
    cv_max_rows = training.get("cv_max_rows")
    if folds == 1 and 0 < rows <= CV_WORTH_ROWS and cv_max_rows is not None:
        return (f"train.cv_max_rows above the {rows:,} training rows (now {cv_max_rows:,}), so cross-validated "
                f"members average away one network's variance and `auto` compares linear and mlp_plr on evidence")
    if fitted and training.get("epochs_run", 0) >= fitted.get("epochs", 0) * folds:
        return (f"train.epochs (now {fitted['epochs']}): every run used all its epochs without stopping early, "
                f"so it was still learning")
    linear = linear_leads(baselines, metric)
    if linear and model and model != "linear":
        return f"train.model linear ({now}): a linear baseline leads on this table"
    if not linear and model == "linear":
        return (f"train.model mlp_plr ({now}): gradient boosting leads, so the table is not linear enough; periodic "
                f"numeric embeddings let the network draw its thresholds")
    return (f"bless.max_baseline_gap (now {max_baseline_gap}) to serve this model with the gap known, since "
            f"training already ran as fitted to this table")


def image_advice(training: dict, baselines: dict[str, dict[str, float]], metric: str, max_baseline_gap: float) -> str:
    """The knob for an image model behind its baselines (the pixel regression, or its own linear probe)."""
    fitted = training.get("fitted") or {}
    leader = max(baselines, key=lambda name: baselines[name][metric])
    if leader.startswith("linear_probe") and training.get("pretrained_freeze") == "backbone":
        return ("a higher train.lr or more train.epochs: with the backbone frozen the head is a linear classifier on "
                "the probe's own features, so it trails the probe only when its training stopped short")
    if leader.startswith("linear_probe"):
        return ("train.pretrained.freeze backbone, or a lower train.lr: the fine-tune lost to a linear classifier on "
                "the pretrained features it started from, so training moved them away from what worked")
    if fitted and training.get("epochs_run", 0) >= fitted.get("epochs", 0):
        return (f"train.epochs (now {fitted['epochs']}), or train.adapt true (it raises epochs to train.min_steps): "
                "every epoch ran without stopping early, so the network was still learning")
    return ("images.augment (more shift or brightness) or wider train.model_args.resnet.widths; or "
            f"bless.max_baseline_gap (now {max_baseline_gap}) to serve this model with the gap known")
