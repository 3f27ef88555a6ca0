"""The declared image contract (the `contract:` section of params.yaml with `modality: image`): what every image of
the set may be. `torchship contract suggest DIR` proposes one from reference images; a person reviews it. Without
one, the rules come from the `images` params and the set itself (its classes, its most common mode, its median
size), tasks/modalities/image/expectations.py rules_for. A spec: fields and their checks, no project imports but
errors."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Range(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float | None = Field(None, allow_inf_nan=False)
    max: float | None = Field(None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}: no image could pass")
        return self


class ReadLimits(BaseModel):
    """What an image must be to be read at all, as the model's training data was read: it travels in the model's
    schema (ImageShape.limits), so the service refuses what prepare refused; a serving host's params may only tighten
    it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_file_bytes: int = Field(ge=1, description="A larger file is refused unread.")
    max_pixels: int = Field(ge=1, description="An image with more pixels (from its header) is refused undecoded.")
    min_side: int = Field(1, ge=1, description="A narrower or lower image is refused.")


class ImageContract(BaseModel):
    """Per set: its classes, how many images and what share may be refused; per image: mode, size, bytes,
    brightness and contrast."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    modality: Literal["image"]
    classes: list[str] = Field(min_length=2, description="The class folders (or manifest labels) there may be: an "
                                                         "image of another class is refused.")
    mode: Literal["L", "RGB"] = Field(description="L: grayscale; RGB: colour (alpha composited on black). An image "
                                                  "of the other kind is refused.")
    width: Range = Range()
    height: Range = Range()
    max_aspect: float = Field(4.0, ge=1.0, description="Longest side over shortest side at most.")
    max_file_bytes: int = Field(20 << 20, ge=1)
    brightness: Range = Range()
    min_contrast: float = Field(1.0, ge=0.0, description="Pixel standard deviation at least (0..255): a blank or "
                                                         "constant image is refused.")
    min_images: int = Field(1, ge=1)
    min_class_share: float = Field(0.0, ge=0.0, lt=1.0)
    max_bad_share: float = Field(0.05, ge=0.0, le=1.0, description="Share of images that may be refused (and "
                                                                   "quarantined) while the run goes on.")


def suggest_image_contract(rows: list[dict], margin: float = 0.1) -> ImageContract:
    """Profile reference images (metadata rows of the decodable ones, tasks/modalities/image/decode.py): the observed
    classes and most common mode, and size, brightness, aspect, contrast and file-size ranges that span every one of
    them (the observed min and max, rounded outwards), then widened by `margin`: the folder it is suggested from
    passes its own contract (but for images of the other mode, which one model cannot take). A starting point to
    review."""
    import math

    import numpy as np

    if not rows:
        raise ValueError("no decodable image to profile")
    classes = sorted({str(r["label"]) for r in rows if r["label"] is not None})
    modes = [r["mode"] for r in rows]

    def spread(key: str) -> tuple[float, float]:
        values = np.array([float(r[key]) for r in rows if r[key] is not None])
        low, high = float(values.min()), float(values.max())
        pad = (high - low) * margin or high * margin
        return low - pad, high + pad

    def whole(key: str) -> Range:
        low, high = spread(key)
        return Range(min=float(max(1, math.floor(low))), max=float(math.ceil(high)))

    def outwards(value: float, up: bool) -> float:   # two decimals, never inside the observed range
        return (math.ceil if up else math.floor)(value * 100) / 100

    low, high = spread("brightness")
    brightness = Range(min=max(0.0, outwards(low, up=False)), max=min(255.0, outwards(high, up=True)))
    lowest_contrast = min(float(r["contrast"]) for r in rows if r["contrast"] is not None)
    return ImageContract(modality="image", classes=classes, mode=max(set(modes), key=modes.count),
                         width=whole("width"), height=whole("height"),
                         max_aspect=max(1.0, outwards(spread("aspect")[1], up=True)),
                         max_file_bytes=int(spread("file_bytes")[1] * 2) + 1,
                         brightness=brightness,
                         min_contrast=min(1.0, outwards(lowest_contrast * (1 - margin), up=False)),
                         min_images=max(1, int(len(rows) * (1 - margin))))


class ImageShape(BaseModel):
    """What an image model takes: (height, width, channels) uint8 pixels of one mode, at this size after the one
    resize rule (tasks/modalities/image/decode.py fit_size)."""

    height: int
    width: int
    channels: int
    mode: Literal["L", "RGB"]
    limits: ReadLimits | None = None   # the rule set its training images were read by; None: exported before it was

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, self.channels


def image_shape(schema) -> ImageShape:
    """An image model's input spec, as prepare wrote it into the schema's `inputs`."""
    return ImageShape.model_validate(schema.inputs)
