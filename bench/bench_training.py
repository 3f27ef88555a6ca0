"""Training throughput: torchship's training loop (tasks.train.fit) vs a plain hand-written PyTorch loop,
same model, data, batch size and thread count, interleaved rounds in one process."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import save  # noqa: E402
from models import build_model  # noqa: E402
from tasks.config import TrainParams  # noqa: E402
from tasks.contract import encode_features, encode_target  # noqa: E402
from tasks.prepare import prepare_tables  # noqa: E402
from tasks.config import PrepareParams  # noqa: E402
from tasks.sources import generate_customers  # noqa: E402
from tasks.train import fit_layout, model_spec  # noqa: E402
from tasks.train_loop import Split, train_model  # noqa: E402

ROWS, EPOCHS, ROUNDS, THREADS = 100_000, 2, 3, 1


def plain_loop(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, params: TrainParams) -> float:
    """The baseline: what an expert writes by hand. Returns samples/s."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr, weight_decay=params.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    started = time.perf_counter()
    for _ in range(EPOCHS):
        order = torch.randperm(len(labels))
        x, y = features[order], labels[order]
        for i in range(0, len(y), params.batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[i:i + params.batch_size]), y[i:i + params.batch_size])
            loss.backward()
            optimizer.step()
    return EPOCHS * len(labels) / (time.perf_counter() - started)


def main() -> None:
    torch.set_num_threads(THREADS)
    prepared = prepare_tables(generate_customers(ROWS, seed=0), "churned", "synthetic", PrepareParams())
    schema = prepared.schema
    train = Split(torch.from_numpy(encode_features(prepared.train, schema)),
                  torch.from_numpy(encode_target(prepared.train["churned"], schema)))
    val = Split(torch.from_numpy(encode_features(prepared.val, schema)),
                torch.from_numpy(encode_target(prepared.val["churned"], schema)))
    params = TrainParams(epochs=EPOCHS, patience=EPOCHS + 1)
    layout = fit_layout(train.features.numpy(), schema)
    spec = model_spec(params)
    ours, theirs = [], []
    for _ in range(ROUNDS):  # interleaved: both see the same machine noise
        torch.manual_seed(0)
        _, history = train_model(build_model(spec["name"], layout, **spec["kwargs"]), train, val, params)
        ours.append(float(np.mean([r["samples_per_s"] for r in history])))
        torch.manual_seed(0)
        theirs.append(plain_loop(build_model(spec["name"], layout, **spec["kwargs"]), train.features, train.labels, params))
    best_ours, best_theirs = max(ours), max(theirs)
    ratio = best_ours / best_theirs
    save("training", "Training samples/s: torchship loop vs plain PyTorch loop",
         {"samples_per_s": round(best_ours), "rounds": ours, "threads": THREADS, "rows": len(train.labels),
          "batch_size": params.batch_size},
         {"samples_per_s": round(best_theirs), "rounds": theirs}, ratio, ">= 0.95x the plain loop", ratio >= 0.95,
         notes="torchship's loop also clips gradients, steps a warmup+cosine schedule and weights classes; "
               "best of interleaved rounds; epoch time excludes validation")


if __name__ == "__main__":
    main()
