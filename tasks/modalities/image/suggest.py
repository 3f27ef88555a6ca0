"""`torchship contract suggest` for images: read every image of the reference once and profile the decodable ones
(what could not be decoded is named, and left out of the profile)."""
from __future__ import annotations

from tasks.modalities.image.contract import suggest_image_contract
from tasks.modalities.image.decode import ImageLimits
from tasks.modalities.image.prepare import inspect_files
from tasks.modalities.image.sources import list_images
from tasks.modalities.interface import Suggestion


def suggest_contract(params, target: str, margin: float) -> Suggestion:
    """The proposed image contract of `params.data.source`."""
    data, images = params.data, params.images
    files, origin = list_images(data.source, target, images.path_column, images.rendered, data.seed)
    limits = ImageLimits(max_file_bytes=int(images.max_file_mb * (1 << 20)), max_pixels=images.max_pixels)
    records = inspect_files(files, limits)   # each measured first, read within the limit
    rows = [r.row() for r in records if r.decodable and r.label is not None]
    skipped = [f"{r.name} ({r.error or 'no class folder'})" for r in records if not (r.decodable and r.label)]
    notes = [f"Left out of the profile: {len(skipped)} image(s): {', '.join(skipped[:10])}"
             f"{' ...' if len(skipped) > 10 else ''}"] if skipped else []
    return Suggestion(suggest_image_contract(rows, margin), origin, len(rows), "images", notes)
