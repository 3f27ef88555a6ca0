"""An image model of your own, as docs/own-model.md describes it:
`train.model: docs.examples.own_image_model:TinyCNN`.

It meets the image contract: built as TinyCNN(layout, **train.model_args[name]) (layout: height, width, channels,
the training split's channel mean and std, n_classes); forward takes raw pixels (B, H, W, C) uint8 at the model's
size and returns (B, n_classes) logits. ImagePreprocessor scales and standardises inside the module, so the served
graph takes the pixels a client sends. `logits_and_embedding` is optional: with it, the monitor watches the
network's own penultimate features (without it, its logits)."""
from __future__ import annotations

from torch import nn

from models.cnn import ImagePreprocessor


class TinyCNN(nn.Module):
    """Preprocessor -> two conv blocks -> global average pool (the embedding) -> Linear."""

    head = "fc"   # the classifier: what trains when train.pretrained.freeze is backbone

    def __init__(self, layout, channels: int = 16):
        super().__init__()
        self.preprocess = ImagePreprocessor(layout)
        self.features = nn.Sequential(
            nn.Conv2d(layout.channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU())
        self.fc = nn.Linear(2 * channels, layout.n_classes)

    def logits_and_embedding(self, pixels):
        embedding = self.features(self.preprocess(pixels)).mean(dim=(2, 3))   # (B, 2 * channels)
        return self.fc(embedding), embedding

    def embed(self, pixels):   # optional: the linear probe of a pretrained backbone fits on these features
        return self.logits_and_embedding(pixels)[1]

    def forward(self, pixels):
        return self.logits_and_embedding(pixels)[0]
