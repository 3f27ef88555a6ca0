"""The declared image contract (the `contract:` section of params.yaml with `modality: image`): what every image of
the set may be. `torchship contract suggest DIR` proposes one from reference images; a person reviews it. Without
one, the rules come from the `images` params and the set itself (its classes, its most common mode, its median
size), tasks/images/expectations.py rules_for. A spec: fields and their checks, no project imports but errors."""
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
    """Profile reference images (metadata rows of the decodable ones, tasks/images/decode.py): the observed classes
    and mode, size and brightness ranges widened by `margin`, the observed aspect and file sizes with room."""
    if not rows:
        raise ValueError("no decodable image to profile")
    classes = sorted({str(r["label"]) for r in rows if r["label"] is not None})
    modes = [r["mode"] for r in rows]
    mode = max(set(modes), key=modes.count)

    def widened(key: str, low: float = 0.0, high: float | None = None, whole: bool = True) -> Range:
        values = [float(r[key]) for r in rows if r[key] is not None]
        spread = (max(values) - min(values)) * margin or max(values) * margin
        lo, hi = max(low, min(values) - spread), max(values) + spread
        if high is not None:
            hi = min(high, hi)
        return Range(min=float(int(lo)) if whole else round(lo, 2), max=float(int(hi + 0.999)) if whole
                     else round(hi, 2))

    return ImageContract(modality="image", classes=classes, mode=mode, width=widened("width", 1),
                         height=widened("height", 1),
                         max_aspect=round(max(r["aspect"] for r in rows) * (1 + margin), 2),
                         max_file_bytes=int(max(r["file_bytes"] for r in rows) * (1 + margin)) + 1,
                         brightness=widened("brightness", 0.0, 255.0, whole=False),
                         min_contrast=round(min(1.0, min(r["contrast"] for r in rows) / 2), 2),
                         min_images=max(1, int(len(rows) * (1 - margin))))
