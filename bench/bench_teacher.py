"""Teacher choice: FT-Transformer vs the MLP on the default data set, same split, epochs and threads.
Reports validation macro-F1 and training time; the MLP is the baseline (the default model)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import save  # noqa: E402
from models import build_model  # noqa: E402
from tasks.config import PrepareParams, TrainParams  # noqa: E402
from tasks.contract import encode_features, encode_target  # noqa: E402
from tasks.core.sources import generate_customers  # noqa: E402
from tasks.prepare import prepare_tables  # noqa: E402
from tasks.training.weights import fit_layout, model_spec  # noqa: E402
from tasks.training.loop import Split, train_model  # noqa: E402

ROWS = int(os.environ.get("BENCH_ROWS", 100_000))
FT_ARGS = {"d_token": 32, "layers": 2, "heads": 4, "dropout": 0.1}


def main() -> None:
    torch.set_num_threads(2)
    prepared = prepare_tables(generate_customers(ROWS, seed=42), "churned", "synthetic", PrepareParams())
    schema = prepared.schema
    split = lambda f: Split(torch.from_numpy(encode_features(f, schema)),  # noqa: E731
                            torch.from_numpy(encode_target(f[schema.target], schema)))
    train, val = split(prepared.train), split(prepared.val)
    layout = fit_layout(train.features.numpy(), schema)
    results = {}
    for name, params in (("mlp", TrainParams(model="mlp", lr=3e-3)), ("ft_transformer", TrainParams(model="ft_transformer",
                                                                                  model_args=FT_ARGS, lr=1e-3))):
        torch.manual_seed(0)
        spec = model_spec(params)
        started = time.perf_counter()
        _, history = train_model(build_model(spec["name"], layout, **spec["kwargs"]), train, val, params, 2)
        results[name] = {"val_f1_macro": round(max(h["val_f1_macro"] for h in history), 4),
                         "train_s": round(time.perf_counter() - started, 1), "epochs": len(history)}
    ft, mlp = results["ft_transformer"], results["mlp"]
    save("teacher", "Teacher candidate: FT-Transformer vs MLP (default data, default epochs)",
         {"ft_val_f1": ft["val_f1_macro"], "ft_train_s": ft["train_s"], "ft_epochs": ft["epochs"]},
         {"mlp_val_f1": mlp["val_f1_macro"], "mlp_train_s": mlp["train_s"], "mlp_epochs": mlp["epochs"]},
         ft["val_f1_macro"] / mlp["val_f1_macro"], "FT F1 > MLP F1 with training < 5 min (pipeline budget 10 min)",
         ft["val_f1_macro"] > mlp["val_f1_macro"] and ft["train_s"] < 300,
         notes=f"ratio = FT-Transformer F1 / MLP F1; FT {FT_ARGS}, lr 1e-3; 2 threads; early stopping as in params.")


if __name__ == "__main__":
    main()
