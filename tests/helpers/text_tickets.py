"""Generated tickets (tasks/modalities/text/generated.py) the text tests make in process: three fixed slices, a
tokenizer fitted on the training one and the schema that carries it, and a small text model trained on them in
seconds (nothing comes from outside)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models import build_model
from models.text import TextLayout
from tasks.core.params_spec import TrainParams
from tasks.core.schema_spec import Schema
from tasks.modalities.text.generated import CLASSES, generate_tickets
from tasks.modalities.text.inputs import text_inputs
from tasks.modalities.text.tokenizer import Tokenizer, fit_tokenizer
from tasks.training.loop import Split, train_model

TOKENS = 48   # ids per text: a ticket's words, nearly all of them


@dataclass(frozen=True)
class Tickets:
    """train / val / holdout texts and class indices, the tokenizer fitted on the training texts, its schema."""

    texts: dict[str, list[str]]
    labels: dict[str, np.ndarray]
    tokenizer: Tokenizer
    schema: Schema

    def ids(self, name: str) -> np.ndarray:
        return self.tokenizer.encode(self.texts[name])

    def split(self, name: str) -> Split:
        """One slice as the training engine takes it."""
        return Split(torch.from_numpy(self.ids(name)), torch.from_numpy(self.labels[name]))

    @property
    def layout(self) -> TextLayout:
        return TextLayout(self.tokenizer.vocab_size, self.tokenizer.max_tokens, len(CLASSES))


def tickets(count: int, seed: int) -> Tickets:
    """`count` tickets in 70/15/15 slices, the tokenizer fitted on the first."""
    frame = generate_tickets(count, seed=seed)
    texts, labels = list(frame["text"]), np.array([CLASSES.index(v) for v in frame["label"]], dtype=np.int64)
    cuts = {"train": slice(0, int(0.7 * count)), "val": slice(int(0.7 * count), int(0.85 * count)),
            "holdout": slice(int(0.85 * count), None)}
    tokenizer = fit_tokenizer(texts[cuts["train"]], TOKENS, min_count=2)
    schema = Schema(source=f"tickets seed {seed}", target="label", classes=list(CLASSES), modality="text",
                    inputs=text_inputs(tokenizer, "text", 20_000))
    return Tickets({name: texts[cut] for name, cut in cuts.items()}, {name: labels[cut] for name, cut in cuts.items()},
                   tokenizer, schema)


def trained(name: str, data: Tickets, model_args: dict, epochs: int = 8, seed: int = 0) -> nn.Module:
    """`name` (a family or package.module:Class) built on the tickets' layout and trained a few epochs, eval mode,
    on one thread (a few hundred short texts: more threads only add overhead on small CPUs)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = build_model(name, data.layout, **model_args)
    settings = TrainParams(model=name, model_args={name: model_args}, epochs=epochs, batch_size=32, lr=0.01,
                           patience=epochs, seed=seed)
    trained_model, _ = train_model(model, data.split("train"), data.split("val"), settings, len(CLASSES))
    return trained_model.eval()
