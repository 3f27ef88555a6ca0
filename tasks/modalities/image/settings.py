"""The image modality's own params section, `images:` (docs/images.md): how image files are read, checked, sized,
served and augmented. The typed loader (tasks/config.py) adds it to the params, as it does every modality's."""
from __future__ import annotations

from pydantic import Field, field_validator

from tasks.core.params_spec import Section


class ImageAugment(Section):
    """Label-safe augmentation of training images (each off where it would change what an image shows)."""

    flip: bool = Field(False, description="Mirror left-right at random: off by default, since a mirrored digit or "
                                          "letter is another symbol; turn it on for photos of objects.")
    shift: int = Field(1, ge=0, le=16, description="Shift by up to this many pixels each way at random (the edge "
                                                   "repeated): a translation keeps the class of nearly every set.")
    brightness: float = Field(0.1, ge=0.0, le=0.5, description="Scale pixel values by up to 1 +- this at random.")


class ImagesParams(Section):
    """The image modality (docs/images.md): how image files are read, checked, sized and augmented."""

    path_column: str = Field("path", description="A manifest's column of image paths (relative to the manifest's "
                                                 "folder, or absolute).")
    size: list[int] | None = Field(None, min_length=2, max_length=2, description="[height, width] the model takes: "
                                                                                 "every image is scaled to cover it "
                                                                                 "(aspect kept), then centre-cropped, "
                                                                                 "in prepare and in the service alike. "
                                                                                 "null = the set's most common size.")
    rendered: int = Field(4000, ge=100, le=1_000_000, description="Images `images:shapes` renders.")
    max_file_mb: float = Field(20.0, gt=0.0, description="A larger image file is refused unread (here and in the "
                                                         "service).")
    max_pixels: int = Field(40_000_000, ge=1, description="An image with more pixels (width x height, from its header) "
                                                          "is refused before it is decoded (here and in the service).")
    min_side: int = Field(4, ge=1, description="A narrower or lower image is refused (a 1x1 image says nothing).")
    serve_pixels_factor: float = Field(64.0, ge=1.0, description="The service refuses unread (413) an image with more "
                                                                 "than this many times the model's own pixels (its "
                                                                 "height x width): far larger than anything it was "
                                                                 "trained on. Raise it to serve full-size photos to a "
                                                                 "small model.")
    max_request_pixels: int = Field(40_000_000, ge=1, description="The service refuses unread (413) a request whose "
                                                                  "images have more pixels than this together (from "
                                                                  "their headers).")
    max_parts: int = Field(256, ge=1, description="The most images (JSON items) or multipart parts one request to the "
                                                  "service may carry; each part at most the file limit.")
    max_aspect: float = Field(4.0, ge=1.0, description="Longest side over shortest side at most, without a contract.")
    size_outlier: float = Field(8.0, gt=1.0, description="Without a contract: a side more than this factor away from "
                                                         "the set's median side is an outlier and refused.")
    min_contrast: float = Field(1.0, ge=0.0, description="Without a contract: a pixel standard deviation (0..255) "
                                                         "below this is a blank or constant image, refused.")
    max_bad_share: float = Field(0.05, ge=0.0, le=1.0, description="Without a contract: the share of images that may "
                                                                   "be refused (each named, all quarantined) while the "
                                                                   "run goes on; above it, prepare fails.")
    augment: ImageAugment = ImageAugment()

    @field_validator("size")
    @classmethod
    def _positive(cls, size: list[int] | None) -> list[int] | None:
        if size is not None and min(size) < 1:
            raise ValueError(f"images.size {size}: height and width must be at least 1")
        return size
