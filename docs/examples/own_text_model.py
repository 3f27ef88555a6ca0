"""A text model of your own, as docs/own-model.md describes it:
`train.model: docs.examples.own_text_model:TinyTextCNN`.

It meets the text contract: built as TinyTextCNN(layout, **train.model_args[name]) (layout: models.text.TextLayout:
vocab_size, max_tokens, n_classes, pad_id, gram_slots); forward takes token ids (B, W) int64 from the run's own
tokenizer (W at most layout.width): a text's first max_tokens words in order (0 pads the end of a text, 1 is an
unknown token), then gram_slots ids of its character n-grams (0 pads; none when the tokenizer has none), and returns
(B, n_classes) logits. This one reads the words only, as a sequence model should. The tokenizer is
inside the served graph, so the module sees ids only. A text with no token at all (a row of padding) must still get
finite logits. `logits_and_embedding` and `embed` are optional: with them, the monitor watches the network's own
pooled features, and a linear probe on pretrained weights fits on them."""
from __future__ import annotations

import torch
from torch import nn


class TinyTextCNN(nn.Module):
    """Token embeddings -> a width-3 convolution over the sequence -> mean over the real tokens (the embedding) ->
    Linear."""

    modality = "text"   # what it takes, as the built-in text families declare it
    head = "fc"         # the classifier: what trains when train.pretrained.freeze is backbone

    def __init__(self, layout, dim: int = 32):
        super().__init__()
        self.pad_id, self.words = layout.pad_id, layout.max_tokens
        self.tokens = nn.Embedding(layout.vocab_size, dim, padding_idx=layout.pad_id)
        self.conv = nn.Conv1d(dim, dim, kernel_size=3, padding=1)
        self.fc = nn.Linear(dim, layout.n_classes)

    def logits_and_embedding(self, ids):
        ids = ids[:, :self.words]                                          # the words, in order
        real = (ids != self.pad_id).unsqueeze(-1).float()                  # (B, T, 1)
        states = torch.relu(self.conv(self.tokens(ids).transpose(1, 2)))   # (B, dim, T)
        pooled = (states.transpose(1, 2) * real).sum(1) / real.sum(1).clamp(min=1.0)   # an empty text: zeros
        return self.fc(pooled), pooled

    def embed(self, ids):   # optional: the linear probe of a pretrained backbone fits on these features
        return self.logits_and_embedding(ids)[1]

    def forward(self, ids):
        return self.logits_and_embedding(ids)[0]
