"""prepare for images: read every file of the source once, judge each by the image contract (GX on the metadata
table), quarantine the refused ones with the report, split the rest stratified, and bring each to the model's size.

One pass names every bad file with every rule it breaks. The run goes on when the refused share is within
`max_bad_share` (the contract's, else `images.max_bad_share`); above it, nothing is written and prepare fails. Either
way every refused file is copied to data/quarantine/ with report.json (file -> rules): nothing is lost."""
from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.labels import class_labels, label_strings
from tasks.core.params_spec import PrepareParams
from tasks.core.quarantine import OutsideFolder, contained_path, quarantine_folder
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageContract, ImageShape, ReadLimits
from tasks.modalities.image.decode import CHANNELS, ImageLimits, Inspected, fit_size, inspect_image
from tasks.modalities.image.expectations import ImageRules, class_skews, judge_images, metadata_table, rules_for
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image.shards import METADATA
from tasks.modalities.image.sources import FileTooLarge, ImageFile, path_refusals

log = logging.getLogger("torchship.prepare")
KEEP_DECODED_BYTES = 256 << 20   # first-pass pixels kept for the second; beyond this budget a file is read again
SHOWN_FILES = 20                 # refused files named in the error message (report.json names all of them)
SPLITS = ("train", "val", "holdout")


@dataclass(frozen=True)
class PreparedImages:
    schema: Schema
    splits: dict[str, pd.DataFrame]      # per split: metadata rows, label in the schema's target, pixels' order
    pixels: dict[str, np.ndarray]        # per split: (n, H, W, C) uint8 at the schema's size
    refused: dict[str, list[str]]        # image name -> every rule it breaks
    rules: ImageRules
    images: int                          # in the source


def limits_of(params: ImagesParams, contract: ImageContract | None) -> ImageLimits:
    max_bytes = contract.max_file_bytes if contract else int(params.max_file_mb * (1 << 20))
    return ImageLimits(max_file_bytes=max_bytes, max_pixels=params.max_pixels)


def inspect_file(file: ImageFile, limits: ImageLimits) -> tuple[Inspected, bytes | None]:
    """One file measured, read no further than the size limit, and checked (never raises on bad input); its bytes
    when they were read."""
    if file.refusal is not None:   # its manifest row points outside the manifest's folder: never opened
        return unread(file, 0, file.refusal), None
    try:
        data = file.read_within(limits.max_file_bytes)
    except FileTooLarge as exc:   # measured (stat) before a byte of it was read
        record = unread(file, exc.size, str(exc))
        record.too_large = True
        return record, None
    except OSError as exc:   # a manifest row naming a file that is not there, or no regular file
        return unread(file, 0, f"cannot be read: {exc}"), None
    return inspect_image(file.name, data, limits, file.label), data


def unread(file: ImageFile, size: int, error: str) -> Inspected:
    """The record of a file that was not read: no content hash (a placeholder no other file shares)."""
    return Inspected(name=file.name, label=file.label, file_bytes=size, sha256="-" + file.name, error=error)


def inspect_files(files: list[ImageFile], limits: ImageLimits) -> list[Inspected]:
    """Every file read (within the size limit) and checked once; decoded pixels are kept while they fit
    KEEP_DECODED_BYTES."""
    found, kept = [], 0
    for file in files:
        record, _ = inspect_file(file, limits)
        if record.pixels is not None:
            kept += record.pixels.nbytes
            if kept > KEEP_DECODED_BYTES:
                record.pixels = None   # read again when its split is written
        found.append(record)
    return found


def model_size(table: pd.DataFrame, params: ImagesParams) -> tuple[int, int]:
    """(height, width) the model takes: images.size, else the most common size of the accepted images."""
    if params.size is not None:
        return params.size[0], params.size[1]
    sizes = Counter(zip(table["height"].astype(int), table["width"].astype(int)))
    return max(sizes, key=lambda size: (sizes[size], size))


def prepare_images(files: list[ImageFile], origin: str, target: str, params: ImagesParams, split: PrepareParams,
                   contract: ImageContract | None = None) -> PreparedImages:
    """The core: read, judge, split, size. Raises DataError (after quarantining) when the refused share is over the
    limit or a class is too small to split."""
    limits = limits_of(params, contract)
    records = inspect_files(files, limits)
    table = metadata_table([r.row() for r in records])
    rules = rules_for(table, params, contract)
    refused = {**judge_images(table, rules).refused, **path_refusals(files)}
    for warning in class_skews(refused, table):
        log.warning("%s: %s", origin, warning)
    if refused:
        folder = quarantine_images(files, refused, origin, len(records), rules.max_bad_share)
        share = len(refused) / len(records)
        listing = _listing(refused)
        if share > rules.max_bad_share:
            raise DataError(f"{origin}: {len(refused)} of {len(records)} images ({share:.1%}) break the image "
                            f"contract, over the {rules.max_bad_share:.0%} it allows (max_bad_share): nothing was "
                            "prepared. "
                            f"Fix or remove them, or raise the share in the contract.\n{listing}\n"
                            f"Every refused file and this report are in {folder}/.")
        log.warning("%s: %d of %d images refused (%.1f%%, within max_bad_share %.0f%%) and quarantined in %s/:\n%s",
                    origin, len(refused), len(records), 100 * share, 100 * rules.max_bad_share, folder, listing)
    good = [r for r in records if r.name not in refused]
    kept = table[~table["name"].isin(refused)].reset_index(drop=True)
    if len(kept) < rules.min_images:
        raise DataError(f"{origin}: {len(kept)} images pass the contract, fewer than its min_images "
                        f"{rules.min_images}.")
    kept["label"] = label_strings(kept["label"])
    classes = class_labels(kept["label"])
    height, width = model_size(kept, params)
    shape = ImageShape(height=height, width=width, channels=CHANNELS[rules.mode], mode=rules.mode,
                       limits=ReadLimits(max_file_bytes=rules.max_file_bytes, max_pixels=rules.max_pixels,
                                         min_side=rules.min_side))   # the service reads by the same rules
    assignment = split_rows(kept, split, origin)
    by_name = {r.name: r for r in good}
    reading = {f.name: f for f in files}
    splits, pixels = {}, {}
    for name in SPLITS:
        rows = kept[assignment == name].reset_index(drop=True)
        pixels[name] = np.stack([sized(by_name[n], reading[n], shape, limits) for n in rows["name"]])
        splits[name] = rows[list(METADATA)].assign(**{target: rows["label"].to_numpy()})
    schema = Schema(source=origin, target=target, classes=classes, modality="image", inputs=shape.model_dump())
    return PreparedImages(schema=schema, splits=splits, pixels=pixels, refused=refused, rules=rules,
                          images=len(records))


def split_rows(table: pd.DataFrame, params: PrepareParams, origin: str) -> np.ndarray:
    """Each image's split ("train", "val", "holdout"), stratified by label, seeded: as tables are split."""
    from sklearn.model_selection import train_test_split

    smallest = table["label"].value_counts().min()
    if smallest < 3:
        raise DataError(f"{origin}: a class has only {smallest} image(s); each class needs at least 3 to appear in "
                        "train, validation and holdout. Add images or merge rare classes.")
    index = np.arange(len(table))
    try:
        rest, holdout = train_test_split(index, test_size=params.holdout_fraction, random_state=params.seed,
                                         stratify=table["label"])
        share = params.val_fraction / (1 - params.holdout_fraction)
        train, val = train_test_split(rest, test_size=share, random_state=params.seed,
                                      stratify=table["label"].iloc[rest])
    except ValueError as exc:
        raise DataError(f"{origin}: {len(table)} images are too few to split {table['label'].nunique()} classes into "
                        f"train, validation and holdout ({exc}). Add images, or raise prepare.val_fraction / "
                        "prepare.holdout_fraction.") from None
    assignment = np.empty(len(table), dtype=object)
    assignment[np.sort(train)], assignment[np.sort(val)], assignment[np.sort(holdout)] = "train", "val", "holdout"
    return assignment


def sized(record: Inspected, file: ImageFile, shape: ImageShape, limits: ImageLimits) -> np.ndarray:
    """The image at the model's size (read again, by the same limits, when the first pass did not keep its
    pixels)."""
    pixels = record.pixels
    if pixels is None:
        again, _ = inspect_file(file, limits)
        if again.pixels is None or again.sha256 != record.sha256:
            raise DataError(f"{record.name} changed while prepare read it ({again.error or 'other content'}): run "
                            "again once the source is still.")
        pixels = again.pixels
    return fit_size(pixels, shape.height, shape.width)


def _listing(refused: dict[str, list[str]]) -> str:
    names = sorted(refused)
    lines = [f"  - {name}: " + "; ".join(refused[name]) for name in names[:SHOWN_FILES]]
    if len(names) > SHOWN_FILES:
        lines.append(f"  ... and {len(names) - SHOWN_FILES} more (report.json names every one)")
    return "\n".join(lines)


def quarantine_images(files: list[ImageFile], refused: dict[str, list[str]], origin: str, total: int,
                      max_share: float) -> Path:
    """A copy of each refused file under its relative name made safe (tasks/core/quarantine.py `contained_path`:
    never outside the quarantine folder), and report.json: file -> rules. A file refused for where its manifest row
    points is not copied (nor read)."""
    folder = quarantine_folder("images")
    for file in files:
        if file.name not in refused or file.refusal is not None:
            continue
        try:
            copy = contained_path(folder / "files", file.name)
            copy.parent.mkdir(parents=True, exist_ok=True)
            if file.path is not None:
                shutil.copy2(file.path, copy)
            else:
                copy.write_bytes(file.read())
        except (OSError, OutsideFolder):   # not there at all (a manifest's missing file): the report names it
            continue
    report = {"gate": "image contract", "status": "fail" if len(refused) / total > max_share else "warn",
              "origin": origin, "images": total, "refused": len(refused), "max_bad_share": max_share,
              "files": {name: refused[name] for name in sorted(refused)}}
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return folder
