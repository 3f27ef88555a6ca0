"""The image contract as Great Expectations suites over the per-image metadata table (GX's own advice for
unstructured data: judge what can be measured of each file). One row per image: decodable, width, height, mode,
file bytes, content hash (an exact duplicate names the image it repeats), brightness, contrast, label.

- `judge_images`: prepare's one pass over every file of the source; each bad file is named with every rule it
  breaks (GX's unexpected rows, by the `name` column).
- `validate_splits`: the validate stage's suite over the written splits: the same per-image rules, the class set,
  the training rows, and no image in two splits (leakage).

The rules come from the declared contract, else from the `images` params and the set itself
(`rules_for`): its classes, its most common mode, its median size.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tasks.core.gate import GateResult
from tasks.core.params_spec import ValidateParams
from tasks.modalities.image.contract import ImageContract
from tasks.modalities.image.settings import ImagesParams

LEAKAGE_RULE = "no image in two splits, nor twice in one (content hash)"
SHOWN_GROUPS = 5   # duplicate groups named in the refusal (the report's rows sample the rest)
# A rule that refuses a class's images SKEW_FACTOR times as often as the other classes' (at least SKEW_MIN_IMAGES of
# them) is named in a warning: a range drawn from reference images may cut one class's tail, not bad images.
SKEW_FACTOR, SKEW_MIN_IMAGES = 5.0, 2
NOT_RANGES = ("decodable", "label ", "not an exact duplicate", "path_")   # rules about the file, not its statistics


@dataclass(frozen=True)
class ImageRules:
    """What every image must be, resolved for one set."""

    classes: list[str]
    mode: str
    width: tuple[float | None, float | None]
    height: tuple[float | None, float | None]
    min_side: int
    max_aspect: float
    max_file_bytes: int
    max_pixels: int
    brightness: tuple[float | None, float | None]
    min_contrast: float
    max_bad_share: float
    min_images: int = 1
    min_class_share: float = 0.0


def rules_for(metadata: pd.DataFrame, params: ImagesParams, contract: ImageContract | None) -> ImageRules:
    """The contract's rules, or the params' with the set's own classes, most common mode and median size."""
    limits = dict(min_side=params.min_side, max_pixels=params.max_pixels)
    if contract is not None:
        return ImageRules(classes=list(contract.classes), mode=contract.mode,
                          width=(contract.width.min, contract.width.max),
                          height=(contract.height.min, contract.height.max), max_aspect=contract.max_aspect,
                          max_file_bytes=contract.max_file_bytes,
                          brightness=(contract.brightness.min, contract.brightness.max),
                          min_contrast=contract.min_contrast, max_bad_share=contract.max_bad_share,
                          min_images=contract.min_images, min_class_share=contract.min_class_share, **limits)
    decoded = metadata[metadata["decodable"]]
    labels = metadata["label"].dropna()
    modes = decoded["mode"].value_counts()

    def around(column: str) -> tuple[float | None, float | None]:
        if decoded.empty:
            return None, None
        median = float(decoded[column].median())
        return median / params.size_outlier, median * params.size_outlier

    return ImageRules(classes=sorted(labels.astype(str).unique()), mode=str(modes.index[0]) if len(modes) else "RGB",
                      width=around("width"), height=around("height"), max_aspect=params.max_aspect,
                      max_file_bytes=int(params.max_file_mb * (1 << 20)), brightness=(None, None),
                      min_contrast=params.min_contrast, max_bad_share=params.max_bad_share, **limits)


def per_image_expectations(rules: ImageRules) -> list[tuple[str, object]]:
    """(rule in words, expectation) for what each image must be; an undecodable file breaks only `decodable`
    (its other cells are empty, which these expectations leave alone)."""
    import great_expectations.expectations as gxe

    def between(column: str, bounds: tuple) -> list:
        low, high = bounds
        return [] if low is None and high is None else [
            (f"{column} within [{_figure(low)}, {_figure(high)}]",
             gxe.ExpectColumnValuesToBeBetween(column=column, min_value=low, max_value=high))]

    return [("decodable (a whole PNG or JPEG within the size limits)",
             gxe.ExpectColumnValuesToBeInSet(column="decodable", value_set=[True])),
            (f"label in the class set {rules.classes}",
             gxe.ExpectColumnValuesToBeInSet(column="label", value_set=rules.classes)),
            ("label present (the image is in a class folder, or its manifest row has a label)",
             gxe.ExpectColumnValuesToNotBeNull(column="label")),
            (f"file bytes at most {rules.max_file_bytes:,}",
             gxe.ExpectColumnValuesToBeBetween(column="file_bytes", max_value=rules.max_file_bytes)),
            (f"pixels at most {rules.max_pixels:,}",
             gxe.ExpectColumnValuesToBeBetween(column="pixels", max_value=rules.max_pixels)),
            (f"both sides at least {rules.min_side} pixels",
             gxe.ExpectColumnValuesToBeBetween(column="short_side", min_value=rules.min_side)),
            *between("width", rules.width), *between("height", rules.height),
            (f"aspect ratio at most {rules.max_aspect:g}",
             gxe.ExpectColumnValuesToBeBetween(column="aspect", max_value=rules.max_aspect)),
            (f"mode {rules.mode} like the rest of the set ({'grayscale' if rules.mode == 'L' else 'colour'})",
             gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=[rules.mode])),
            (f"contrast at least {rules.min_contrast:g} (not blank or constant)",
             gxe.ExpectColumnValuesToBeBetween(column="contrast", min_value=rules.min_contrast)),
            *between("brightness", rules.brightness),
            ("not an exact duplicate of another image (a copy in another split would leak it into the holdout)",
             gxe.ExpectColumnValuesToBeNull(column="duplicate_of"))]


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def metadata_table(rows: list[dict]) -> pd.DataFrame:
    """The metadata rows as GX judges them: plus each image's shorter side and the image it duplicates (the first
    of its content hash, by name)."""
    table = pd.DataFrame(rows)
    table["short_side"] = table[["width", "height"]].astype(float).min(axis=1)
    first = table.sort_values("name").drop_duplicates("sha256").set_index("sha256")["name"]
    kept = table["sha256"].map(first)
    table["duplicate_of"] = kept.where(kept != table["name"], None)
    return table


@dataclass(frozen=True)
class Verdicts:
    """The per-image suite's outcome: each refused image with every rule it breaks, and the GX rows."""

    refused: dict[str, list[str]]     # image name -> rules broken (with the value, and a decoder's own words)
    results: list[dict]               # one row per expectation: for the report and Data Docs


def judge_images(table: pd.DataFrame, rules: ImageRules, docs_dir: Path | None = None) -> Verdicts:
    """GX over the metadata table: every image, every per-image rule, one pass."""
    context, source = _context()
    suite = per_image_expectations(rules)
    refused: dict[str, list[str]] = {}
    results = []
    for (words, expectation), check in zip(suite, _run(context, source, "images", [e for _, e in suite], table)):
        results.append(_result_row("images", words, check))
        for bad in check.result.get("unexpected_index_list") or []:
            name = bad["name"]
            value = bad.get(expectation.column)
            detail = _why(table, name) if expectation.column == "decodable" else f"got {_plain(value)}"
            refused.setdefault(name, []).append(f"{words}: {detail}")
    _copy_docs(context, docs_dir)
    return Verdicts(refused=refused, results=results)


def class_skews(refused: dict[str, list[str]], table: pd.DataFrame) -> list[str]:
    """One warning per (rule, class) where a range rule refuses a share of one class far above its share of the
    other classes (SKEW_FACTOR times, at least SKEW_MIN_IMAGES images), naming the rule, the class and both shares."""
    from collections import Counter, defaultdict

    labels = {name: None if label is None else str(label) for name, label in zip(table["name"], table["label"])}
    totals = Counter(label for label in labels.values() if label is not None)
    counts: dict[str, Counter] = defaultdict(Counter)
    for name, broken in refused.items():
        for rule in {entry.split(": ", 1)[0] for entry in broken}:
            if not rule.startswith(NOT_RANGES) and labels.get(name) is not None:
                counts[rule][labels[name]] += 1
    warnings = []
    for rule, by_class in sorted(counts.items()):
        for label, count in sorted(by_class.items()):
            share = count / totals[label]
            others = (sum(by_class.values()) - count) / max(1, sum(totals.values()) - totals[label])
            if count >= SKEW_MIN_IMAGES and share >= SKEW_FACTOR * others:
                warnings.append(f"rule '{rule}' refuses {count} of the {totals[label]} images of class '{label}' "
                                f"({share:.1%}), the other classes {others:.1%}: a range drawn from reference images "
                                "may cut one class's tail. Genuine images? Widen the rule in the contract.")
    return warnings


def _plain(value) -> str:
    """A cell as a person reads it: 0.0 rather than np.float64(0.0), text quoted."""
    value = value.item() if hasattr(value, "item") else value
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


def _why(table: pd.DataFrame, name: str) -> str:
    error = table.loc[table["name"] == name, "error"].iloc[0]
    return str(error) if error else "not decodable"


def validate_splits(splits: dict[str, pd.DataFrame], rules: ImageRules, params: ValidateParams,
                    docs_dir: Path | None = None) -> tuple[GateResult, list[dict]]:
    """The validate stage's gate on the written splits' metadata: per-image rules on each split, the training
    split's size and class shares, and no content hash in two splits."""
    import great_expectations.expectations as gxe

    context, source = _context()
    failures, warnings, rows = [], [], []
    for split, frame in splits.items():
        frame = frame.assign(short_side=frame[["width", "height"]].min(axis=1), duplicate_of=None)
        suite = [e for e in per_image_expectations(rules) if "class set" not in e[0]] + [
            (f"label in the class set {rules.classes}", gxe.ExpectColumnValuesToBeInSet(column="label",
                                                                                       value_set=rules.classes)),
            (f"at least {params.min_rows if split == 'train' else 1} images",
             gxe.ExpectTableRowCountToBeBetween(min_value=params.min_rows if split == "train" else 1))]
        for (words, _), check in zip(suite, _run(context, source, split, [e for _, e in suite], frame)):
            row = _result_row(split, words, check)
            rows.append(row)
            if not check.success:
                failures.append(f"{split}: {words} ({row['unexpected_count']} images, e.g. {row['sample']})")
    # each image named with its split, so the refusal says which copy sits in which split
    union = pd.concat([f.assign(split=s, name=f["name"].astype(str) + f" ({s})") for s, f in splits.items()],
                      ignore_index=True)
    unique = gxe.ExpectColumnValuesToBeUnique(column="sha256")
    check = _run(context, source, "leakage", [unique], union)[0]
    rows.append(_result_row("all splits", LEAKAGE_RULE, check))
    if not check.success:
        failures.append(_shared_content(union, check))
    if rules.min_class_share:
        shares = splits["train"]["label"].value_counts(normalize=True)
        failures += [f"train: class '{c}' holds {shares.get(c, 0.0):.3f} of the images (rule: min_class_share "
                     f"{rules.min_class_share})" for c in rules.classes if shares.get(c, 0.0) < rules.min_class_share]
    _copy_docs(context, docs_dir)
    evidence = str(docs_dir / "index.html") if docs_dir is not None else None
    return GateResult.decide("image contract", failures, warnings, evidence=evidence,
                             passed=f"{len(rows)} expectations passed"), rows


def _shared_content(union: pd.DataFrame, check) -> str:
    """The leakage refusal: each content hash held by more than one image, as its copies (name (split))."""
    named = {str(row.get("name")) for row in check.result.get("unexpected_index_list") or []}
    groups = [group for _, group in union[union["name"].isin(named)].groupby("sha256", sort=False)]
    across = sum(group["split"].nunique() > 1 for group in groups)
    shown = "; ".join(" = ".join(group["name"]) for group in groups[:SHOWN_GROUPS])
    more = f"; ... and {len(groups) - SHOWN_GROUPS} more" if len(groups) > SHOWN_GROUPS else ""
    return (f"rule: {LEAKAGE_RULE}: {len(groups)} content hash(es) held by more than one image, {across} across "
            f"splits (leakage: an image training saw would be scored again): {shown}{more}")


def _context():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.execution_engine import pandas_execution_engine

    pandas_execution_engine.HASH_THRESHOLD = 0   # tasks/modalities/table/expectations.py says why
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context, context.data_sources.add_pandas(name="torchship-images")


def _run(context, source, name: str, expectations: list, frame: pd.DataFrame) -> list:
    """The suite on `frame`, every unexpected row named by its `name` column; one result per expectation, in the
    order given."""
    import great_expectations as gx

    batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("all")
    suite = context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
    result_format = {"result_format": "COMPLETE", "unexpected_index_column_names": ["name"]}
    results = definition.run(batch_parameters={"dataframe": frame}, result_format=result_format).results
    by_key = {(r.expectation_config.type, r.expectation_config.kwargs.get("column")): r for r in results}
    return [by_key[(e.expectation_type, getattr(e, "column", None))] for e in expectations]


def _sample(check) -> list[str]:
    return [str(row.get("name")) for row in (check.result.get("unexpected_index_list") or [])[:3]]


def _result_row(split: str, words: str, check) -> dict:
    config = check.expectation_config
    return {"split": split, "expectation": config.type, "rule": words, "column": config.kwargs.get("column"),
            "success": bool(check.success), "unexpected_count": int(check.result.get("unexpected_count") or 0),
            "sample": _sample(check)}


def _copy_docs(context, docs_dir: Path | None) -> None:
    if docs_dir is None:
        return
    site = Path(context.build_data_docs()["local_site"].removeprefix("file://")).parent
    shutil.rmtree(docs_dir, ignore_errors=True)
    shutil.copytree(site, docs_dir)
