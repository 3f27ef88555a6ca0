"""Cross-validated training for small tables: k stratified folds, one member per fold, each
early-stopped on an inner split of its own training part (never on the fold it is scored on), so the out-of-fold
probabilities are out of sample for everything fitted on them: they are the model-selection figure, and with
several candidate families (`train.model: auto`) the family that scores best out of fold is served, as one
module averaging its members' probabilities (models/ensemble.py).

Engine-agnostic: `start` builds a set-up trainer for each fold (torchrun's JobTrainer with a checkpoint folder per
fold in tasks/training/job.py, the plain Trainer in tests), so the folds run through the same loop, DDP wrapping
and checkpoints as a single run, one after another in the same job.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models import build_model
from models.ensemble import FoldEnsemble
from models.tabular import FeatureLayout
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import TrainParams
from tasks.training.adapt import FittedTraining
from tasks.training.calibration import calibrate, tempered
from tasks.training.decision import decision_headline, fit_class_weighting, fit_threshold
from tasks.training.loop import STOP_ON_LOSS, Split, Trainer, predict_logits
from tasks.training.weights import model_spec

# The out-of-fold figure families are compared on.
SELECTION_METRIC = "f1_macro"
# A member early-stops on 1 / INNER_FOLDS of its training part, stratified, on validation log-loss. Stopping on
# the held-out fold instead made the out-of-fold figures optimistic (breast cancer: 0.982 out of fold for 0.962 on
# the holdout) and biased what is fitted on them; on a few dozen rows F1 saturates, the loss keeps moving.
INNER_FOLDS = 8

# (settings, tag such as "mlp fold 2/5", model, member's training rows, its early-stopping rows, what early
# stopping judges: STOP_ON_LOSS or STOP_ON_F1) -> a set-up trainer
StartFold = Callable[[TrainParams, str, nn.Module, Split, Split, str], Trainer]


@dataclass(frozen=True)
class Candidate:
    """One family cross-validation trains: its fitted settings (model and lr its own) and constructor spec."""

    name: str
    settings: TrainParams
    spec: dict


@dataclass
class FamilyRun:
    """A candidate's k members and what they scored out of fold."""

    candidate: Candidate
    members: list[dict]               # best state dict per fold (empty dicts on ranks > 0 under FSDP)
    history: list[dict]               # every fold's epoch records, each with its "fold" (1-based)
    out_of_fold: np.ndarray | None    # (N, C) log-probabilities, each row from the one member that never trained on it
    scores: dict[str, float]          # out-of-fold accuracy and f1_macro (empty where not scored)


def fold_assignment(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """(N,) fold index per row, stratified: each class's rows are shuffled and dealt round the folds, continuing
    where the previous class stopped, so every fold holds each class's share and sizes differ by at most one."""
    rng = np.random.default_rng(seed)
    assignment = np.empty(len(labels), dtype=np.int64)
    dealt = 0
    for label in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == label))
        assignment[rows] = (dealt + np.arange(len(rows))) % folds
        dealt += len(rows)
    return assignment


def candidates_for(settings: TrainParams, fitted: FittedTraining) -> list[Candidate]:
    """The families `fitted` compares, each with its own model, lr and constructor arguments."""
    candidates = []
    for name, lr in fitted.candidates.items():
        own = settings.model_copy(update={"model": name, "lr": lr})
        candidates.append(Candidate(name, own, model_spec(own)))
    return candidates


def cross_validation_rows(train: Split, val: Split) -> Split:
    """The rows cross-validation deals into folds: the training and the validation split together. Each member
    early-stops on its own inner split, so a separate validation split would only be rows nothing learns from
    (15% of a small table); the out-of-fold figures still judge every row out of sample, the holdout stays out."""
    soft = None if train.soft is None or val.soft is None else torch.cat([train.soft, val.soft])
    return Split(torch.cat([train.features, val.features]), torch.cat([train.labels, val.labels]), soft)


def _rows(split: Split, mask: torch.Tensor) -> Split:
    return Split(split.features[mask], split.labels[mask], None if split.soft is None else split.soft[mask])


def inner_split(part: Split, seed: int) -> tuple[Split, Split]:
    """(rows a member trains on, rows it early-stops on): a stratified 1 / INNER_FOLDS of its training part."""
    stop = torch.from_numpy(fold_assignment(part.labels.cpu().numpy(), INNER_FOLDS, seed) == 0)
    stop = stop.to(part.features.device)
    return _rows(part, ~stop), _rows(part, stop)


def train_family(candidate: Candidate, train: Split, layout: FeatureLayout, assignment: np.ndarray, n_classes: int,
                 start: StartFold, score: bool = True) -> FamilyRun:
    """k members of one family, fold after fold, each trained and early-stopped on its training part alone; with
    `score`, their out-of-fold log-probabilities (each row scored by the one member that never saw it) and scores.
    The layout (standardisation, category counts) is the whole training split's, shared by every member so the
    served ensemble has one front: the held-out fold's labels never reach it."""
    folds = int(assignment.max()) + 1
    members, history = [], []
    out_of_fold = np.zeros((len(assignment), n_classes), dtype=np.float32) if score else None
    for fold in range(folds):
        held = torch.from_numpy(assignment == fold).to(train.features.device)
        # Members differ in their data and also in their initialisation and shuffling.
        settings = candidate.settings.model_copy(update={"seed": candidate.settings.seed + fold})
        torch.manual_seed(settings.seed)
        model = build_model(candidate.spec["name"], layout, **candidate.spec["kwargs"])
        held_out = _rows(train, held)
        fit, stop = inner_split(_rows(train, ~held), settings.seed)
        trainer = start(settings, f"{candidate.name} fold {fold + 1}/{folds}", model, fit, stop, STOP_ON_LOSS)
        state = trainer.train()
        trainer.close()
        members.append(state.best_state)
        history += [{**record, "fold": fold + 1} for record in state.history]
        if score:
            member = build_model(candidate.spec["name"], layout, **candidate.spec["kwargs"])
            member.load_state_dict(state.best_state)
            logits = predict_logits(member, held_out.features.cpu())
            out_of_fold[held.cpu().numpy()] = torch.log_softmax(logits, 1).numpy()
    scores = (classification_metrics(train.labels.cpu().numpy(), out_of_fold.argmax(1), n_classes)
              if score else {})
    return FamilyRun(candidate, members, history, out_of_fold, scores)


def pick_family(runs: list[FamilyRun]) -> FamilyRun:
    """The best out-of-fold SELECTION_METRIC; on a tie the earlier (simpler) candidate."""
    return max(runs, key=lambda run: (run.scores[SELECTION_METRIC], -runs.index(run)))


def cross_validate(candidates: list[Candidate], train: Split, layout: FeatureLayout, n_classes: int, folds: int,
                   seed: int, start: StartFold, score: bool = True) -> tuple[FamilyRun, list[FamilyRun]]:
    """Every candidate on the same folds; (the chosen run, all runs). Without `score` (ranks > 0, which hold no
    weights under FSDP) nothing is compared and the first run is returned."""
    assignment = fold_assignment(train.labels.cpu().numpy(), folds, seed)
    runs = [train_family(c, train, layout, assignment, n_classes, start, score) for c in candidates]
    return (pick_family(runs) if score else runs[0]), runs


def ensemble_of(run: FamilyRun, layout: FeatureLayout, temperature: float = 1.0,
                class_bias: list[float] | None = None) -> FoldEnsemble:
    """The run's members as one module that averages their probabilities (eval mode, on the CPU)."""
    members = []
    for state in run.members:
        member = build_model(run.candidate.spec["name"], layout, **run.candidate.spec["kwargs"])
        member.load_state_dict(state)
        members.append(member)
    return FoldEnsemble(members, temperature, class_bias).eval()


def ensemble_spec(run: FamilyRun, class_bias: bool = False) -> dict:
    """What `load_trained` rebuilds the ensemble from: the member family's spec, how many members, and whether it
    carries a class bias."""
    return {**run.candidate.spec, "members": len(run.members), **({"class_bias": True} if class_bias else {})}


def cross_validation_summary(chosen: FamilyRun, runs: list[FamilyRun], calibration: dict | None = None) -> dict:
    """For metrics.json, the headline and MLflow: folds, the chosen family, every candidate's out-of-fold scores,
    and the chosen run's calibration (tasks/training/calibration.py)."""
    return {"folds": len(chosen.members), "rows": len(chosen.out_of_fold), "trained_on": "training + validation splits",
            "metric": SELECTION_METRIC, "chosen": chosen.candidate.name,
            "out_of_fold": chosen.scores, "candidates": {run.candidate.name: run.scores for run in runs},
            "calibration": calibration}


def candidate_scores(summary: dict) -> str:
    """e.g. 'linear 0.9712, mlp 0.9655': every candidate's out-of-fold selection score."""
    return ", ".join(f"{name} {scores[summary['metric']]:.4f}" for name, scores in summary["candidates"].items())


def cross_validation_headline(summary: dict) -> str:
    """e.g. '5-fold out-of-fold f1_macro 0.9712 (linear 0.9712, mlp 0.9655: picked linear)'."""
    metric = summary["metric"]
    text = f"{summary['folds']}-fold out-of-fold {metric} {summary['out_of_fold'][metric]:.4f}"
    if len(summary["candidates"]) > 1:
        text += f" ({candidate_scores(summary)}: picked {summary['chosen']})"
    calibration = summary.get("calibration")
    if calibration and calibration["temperature"] != 1.0:
        text += (f", temperature {calibration['temperature']:.3g} (out-of-fold ECE {calibration['ece_before']:.3f} "
                 f"-> {calibration['ece_after']:.3f})")
    if summary.get("decision"):
        text += f", {decision_headline(summary['decision'])}"
    weighting = summary.get("class_weighting")
    if weighting:
        text += (f", class weighting {weighting['weighting']} (out-of-fold {weighting['metric']} "
                 f"{weighting['at_trained']:.4f} as trained {weighting['trained_with']}, "
                 f"{weighting['at_other']:.4f} shifted)")
    return text


def finish_cross_validation(chosen: FamilyRun, runs: list[FamilyRun], layout: FeatureLayout,
                            fitted: FittedTraining, labels: np.ndarray, metric: str = SELECTION_METRIC,
                            balanced: bool = True) -> tuple[FoldEnsemble, dict, FittedTraining, dict]:
    """On rank 0 after the folds: (the served ensemble, temperature-scaled where its out-of-fold predictions are
    off, its spec, the fitted training with the chosen family in, the summary for the report, whose "decision" is
    a binary model's threshold for the bless `metric` and "class_weighting" a multi-class model's, both fitted on
    the calibrated out-of-fold probabilities). `labels`: the rows' the out-of-fold predictions are in the order of;
    `balanced`: whether the members were trained with class-balanced loss weights."""
    calibration = calibrate(chosen.out_of_fold, labels)
    summary = cross_validation_summary(chosen, runs, calibration)
    calibrated = tempered(chosen.out_of_fold, calibration["temperature"])
    summary["decision"] = fit_threshold(calibrated, labels, metric, "out-of-fold")
    summary["class_weighting"] = fit_class_weighting(np.log(np.maximum(calibrated, 1e-12)), labels, metric, balanced)
    shifted = summary["class_weighting"] and any(summary["class_weighting"]["class_bias"])
    bias = summary["class_weighting"]["class_bias"] if shifted else None
    name = chosen.candidate.name
    if len(runs) > 1:
        fitted = fitted.model_copy(update={"model": name, "lr": fitted.candidates[name], "reasons": [
            *fitted.reasons, f"auto picked {name} by out-of-fold {summary['metric']}: {candidate_scores(summary)}"]})
    return (ensemble_of(chosen, layout, calibration["temperature"], bias), ensemble_spec(chosen, bias is not None),
            fitted, summary)
