"""The figures behind `train.model: auto`: the FT-Transformer vs the MLP by table size, each trained as the
pipeline trains it (`adapt` on: batch, epochs and patience fitted to the rows, the model's own lr), on the
same stratified split; holdout macro-F1 (early stopping sees only validation) and training time.

The synthetic default table at several sizes plus scikit-learn's digits. The MLP is the baseline; the
ratio is FT / MLP macro-F1 at the largest size, and `auto` should pick whichever wins at each size (the
rule is `train.ft_min_rows`).  Usage: python bench/bench_auto_model.py  (BENCH_SIZES=3000,10000 to trim)
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import save  # noqa: E402
from models import build_model  # noqa: E402
from tasks.core.labels import encode_target
from tasks.core.metrics import classification_metrics  # noqa: E402
from tasks.core.params_spec import PrepareParams, TrainParams  # noqa: E402
from tasks.modalities.table.encoding import encode_features  # noqa: E402
from tasks.modalities.table.layout import fit_layout
from tasks.modalities.table.prepare import prepare_tables  # noqa: E402
from tasks.modalities.table.sources import generate_customers, load_sklearn  # noqa: E402
from tasks.training.adapt import fit_training, fitted_settings  # noqa: E402
from tasks.training.loop import Split, predict_logits, train_model  # noqa: E402
from tasks.training.weights import model_spec  # noqa: E402

SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "3000,10000,30000,100000").split(",")]
MODELS = ("mlp", "ft_transformer")


def tables():
    for rows in SIZES:
        yield f"synthetic {rows:,}", generate_customers(rows, seed=42), "churned", "synthetic"
    digits = load_sklearn("digits")
    yield "digits 1,797", digits, "target", "sklearn:digits"


def measure(frame, target: str, source: str) -> dict:
    prepared = prepare_tables(frame, target, source, PrepareParams())
    schema = prepared.schema
    split = lambda f: Split(torch.from_numpy(encode_features(f, schema)),  # noqa: E731
                            torch.from_numpy(encode_target(f[schema.target], schema)))
    train, val, holdout = split(prepared.train), split(prepared.val), split(prepared.holdout)
    layout = fit_layout(train.features.numpy(), schema)
    results = {"train_rows": len(train.labels)}
    for name in MODELS:
        fitted = fit_training(TrainParams(model=name), len(train.labels))
        settings = fitted_settings(TrainParams(model=name), fitted)
        torch.manual_seed(0)
        spec = model_spec(settings)
        started = time.perf_counter()
        model, history = train_model(build_model(spec["name"], layout, **spec["kwargs"]), train, val, settings,
                                     len(schema.classes))
        seconds = time.perf_counter() - started
        predicted = predict_logits(model, holdout.features).argmax(1).numpy()
        scores = classification_metrics(holdout.labels.numpy(), predicted, len(schema.classes))
        results[name] = {"holdout_f1_macro": round(scores["f1_macro"], 4), "train_s": round(seconds, 1),
                         "epochs": len(history), "batch": fitted.batch_size}
    return results


def main() -> None:
    torch.set_num_threads(2)
    measured = {}
    for label, frame, target, source in tables():
        measured[label] = measure(frame, target, source)
        print(label, measured[label], flush=True)
    figures = {label: {"rows": r["train_rows"], **{f"{m}_f1": r[m]["holdout_f1_macro"] for m in MODELS},
                       **{f"{m}_s": r[m]["train_s"] for m in MODELS},
                       "auto": "mlp" if r["train_rows"] < TrainParams().ft_min_rows else "ft_transformer",
                       "winner": max(MODELS, key=lambda m: r[m]["holdout_f1_macro"])}
               for label, r in measured.items()}
    largest = measured[f"synthetic {max(SIZES):,}"]
    picked_right = [f["auto"] == f["winner"] or abs(f["mlp_f1"] - f["ft_transformer_f1"]) < 0.005
                    for f in figures.values()]
    save("auto_model", "train.model auto: FT-Transformer vs MLP by training rows (holdout macro-F1, adapt on)",
         figures, {"rule": f"mlp below train.ft_min_rows = {TrainParams().ft_min_rows:,} training rows"},
         largest["ft_transformer"]["holdout_f1_macro"] / largest["mlp"]["holdout_f1_macro"],
         "auto picks the better model (or one within 0.5 point) at every size", all(picked_right),
         notes="ratio = FT / MLP holdout macro-F1 at the largest synthetic size. Each model trained as the pipeline "
               "does (train.adapt: batch, epochs, patience fitted to the rows; lr mlp 3e-3, ft 1e-3); same split "
               "(prepare defaults), seed 0, 2 threads; early stopping on validation, scored on holdout.")


if __name__ == "__main__":
    main()
