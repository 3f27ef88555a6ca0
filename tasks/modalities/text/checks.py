"""The text contract judged on a per-text metadata table: one row per text (decodable, blank, length in characters
and tokens, control and invisible characters, non-letter share, label, exact copy, near copy in another split), and
the rules as data, so that one pass names every bad text with every rule it breaks: here in pandas (fast: ingest,
tests), and the same rules as a Great Expectations suite (tasks/modalities/text/expectations.py) for the report.

The rules come from the declared contract, else from the `text` params and the set itself (its classes).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.quarantine import quarantine_folder
from tasks.modalities.text.contract import TextContract, class_ratio
from tasks.modalities.text.descriptors import CONTROL, ZERO_WIDTH, non_letter_share
from tasks.modalities.text.near_duplicates import content_hash, cross_split_near_duplicates
from tasks.modalities.text.settings import TextParams
from tasks.modalities.text.sources import TextRecord

MEASURED = ("chars", "tokens", "blank", "control_chars", "zero_width_chars", "non_letter_share", "sha256")


@dataclass(frozen=True)
class TextRules:
    """What every text must be, resolved for one set."""

    classes: list[str]
    chars: tuple[int, int]
    tokens: tuple[int, int | None]
    max_control_chars: int
    max_zero_width_chars: int
    max_non_letter_share: float
    allow_duplicates: bool
    near_duplicate_jaccard: float
    max_class_ratio: float
    max_bad_share: float
    min_texts: int = 1
    min_class_share: float = 0.0


@dataclass(frozen=True)
class Rule:
    """One per-text rule: a column's cells must be in `allowed`, within [low, high], or null (`null`); an empty
    cell (a text that could not be read has no length) breaks only the rules that ask for a value."""

    words: str
    column: str
    allowed: tuple | None = None
    low: float | None = None
    high: float | None = None
    null: bool | None = None    # True: must be null; False: must not be


@dataclass(frozen=True)
class Verdicts:
    """Each refused text with every rule it breaks, and how many texts break each rule."""

    refused: dict[str, list[str]]
    counts: dict[str, int]


def rules_for(labels: Sequence[str | None], params: TextParams, contract: TextContract | None) -> TextRules:
    """The contract's rules, or the params' with the set's own classes."""
    if contract is not None:
        return TextRules(classes=list(contract.classes), chars=(contract.min_chars, contract.max_chars),
                         tokens=(contract.min_tokens, contract.max_tokens),
                         max_control_chars=contract.max_control_chars,
                         max_zero_width_chars=contract.max_zero_width_chars,
                         max_non_letter_share=contract.max_non_letter_share,
                         allow_duplicates=contract.allow_duplicates,
                         near_duplicate_jaccard=contract.near_duplicate_jaccard,
                         max_class_ratio=contract.max_class_ratio, max_bad_share=contract.max_bad_share,
                         min_texts=contract.min_texts, min_class_share=contract.min_class_share)
    return TextRules(classes=sorted({str(label) for label in labels if label is not None}),
                     chars=(params.min_chars, params.max_chars), tokens=(1, params.max_tokens),
                     max_control_chars=params.max_control_chars, max_zero_width_chars=params.max_zero_width_chars,
                     max_non_letter_share=params.max_non_letter_share, allow_duplicates=params.allow_duplicates,
                     near_duplicate_jaccard=params.near_duplicate_jaccard, max_class_ratio=params.max_class_ratio,
                     max_bad_share=params.max_bad_share)


def measure(text: str) -> dict:
    """A decodable text's measured cells of the metadata table."""
    return {"chars": len(text), "tokens": len(text.split()), "blank": not text.strip(),
            "control_chars": len(CONTROL.findall(text)), "zero_width_chars": len(ZERO_WIDTH.findall(text)),
            "non_letter_share": non_letter_share(text), "sha256": content_hash(text)}


def metadata_table(records: Sequence[TextRecord], splits: Sequence[str] | None = None,
                   near_jaccard: float = 0.8) -> pd.DataFrame:
    """One row per record: what it is, what was measured, the text it copies (the first with its content hash) and,
    with `splits`, a near copy of it in an earlier split (train < val < holdout: the later copy is the leak)."""
    empty = dict.fromkeys(MEASURED)
    rows = [{"name": r.name, "label": r.label, "split": None if splits is None else splits[i],
             "decodable": r.text is not None, "error": r.error, "too_large": r.too_large,
             "raw_bytes": r.raw_bytes_len, **(measure(r.text) if r.text is not None else empty)}
            for i, r in enumerate(records)]
    table = pd.DataFrame(rows, columns=["name", "label", "split", "decodable", "error", "too_large", "raw_bytes",
                                        *MEASURED])
    hashed = table[table["sha256"].notna()]
    first = hashed.drop_duplicates("sha256").set_index("sha256")["name"]
    kept = table["sha256"].map(first)
    table["duplicate_of"] = kept.where(kept.notna() & (kept != table["name"]), None)
    table["near_duplicate_of"], table["near_jaccard"] = None, np.nan
    if splits is not None:
        partner, similarity = cross_split_near_duplicates([r.text for r in records], splits, near_jaccard)
        leaked = partner >= 0
        table.loc[leaked, "near_duplicate_of"] = [f"{table['name'].iat[p]} ({table['split'].iat[p]})"
                                                  for p in partner[leaked]]
        table.loc[leaked, "near_jaccard"] = similarity[leaked]
    return table


def per_text_rules(rules: TextRules) -> list[Rule]:
    """Every rule a text must keep, in words with its limit."""
    low, high = rules.chars
    found = [Rule("decodable (UTF-8 text within the byte cap, not binary)", "decodable", allowed=(True,)),
             Rule("label present (the text is in a class folder, or its row has a label)", "label", null=False),
             Rule(f"label in the class set {rules.classes}", "label", allowed=tuple(rules.classes)),
             Rule("not empty or whitespace-only", "blank", allowed=(False,)),
             Rule(f"length within [{low:,}, {high:,}] characters", "chars", low=low, high=high)]
    low, high = rules.tokens
    if low or high is not None:
        shown = "-" if high is None else f"{high:,}"
        found.append(Rule(f"tokens within [{low:,}, {shown}] (whitespace-separated)", "tokens", low=low, high=high))
    found += [Rule(f"control characters at most {rules.max_control_chars}", "control_chars",
                   high=rules.max_control_chars),
              Rule(f"zero-width and bidi characters at most {rules.max_zero_width_chars}", "zero_width_chars",
                   high=rules.max_zero_width_chars),
              Rule(f"non-letter share at most {rules.max_non_letter_share:g}", "non_letter_share",
                   high=rules.max_non_letter_share),
              Rule(f"no near duplicate in an earlier split (word-pair Jaccard >= {rules.near_duplicate_jaccard:g}: "
                   "leakage into evaluation)", "near_duplicate_of", null=True)]
    if not rules.allow_duplicates:
        found.append(Rule("not an exact copy of another text (after NFKC and whitespace normalisation)",
                          "duplicate_of", null=True))
    return found


def breaks(table: pd.DataFrame, rule: Rule) -> pd.Series:
    """Which rows break `rule` (an empty cell breaks only a rule that asks for a value)."""
    cells = table[rule.column]
    if rule.null is not None:
        return cells.notna() if rule.null else cells.isna()
    present = cells.notna()
    if rule.allowed is not None:
        return present & ~cells.isin(list(rule.allowed))
    values = pd.to_numeric(cells, errors="coerce")
    low = values < rule.low if rule.low is not None else False
    high = values > rule.high if rule.high is not None else False
    return present & (low | high)


def why(row: pd.Series, rule: Rule) -> str:
    """The rule and what this text has instead."""
    if rule.column == "decodable":
        return f"{rule.words}: {row['error'] or 'not decodable'}"
    if rule.column == "duplicate_of":
        return f"{rule.words}: a copy of {row['duplicate_of']}"
    if rule.column == "near_duplicate_of":
        return f"{rule.words}: near {row['near_duplicate_of']}, Jaccard {row['near_jaccard']:.2f}"
    value = row[rule.column]
    value = value.item() if hasattr(value, "item") else value
    return f"{rule.words}: got {value:.4g}" if isinstance(value, float) else f"{rule.words}: got {value!r}"


def judge_texts(table: pd.DataFrame, rules: TextRules) -> Verdicts:
    """Every text, every per-text rule, one pass."""
    refused: dict[str, list[str]] = {}
    counts = {}
    for rule in per_text_rules(rules):
        bad = table[breaks(table, rule)]
        counts[rule.words] = len(bad)
        for _, row in bad.iterrows():
            refused.setdefault(str(row["name"]), []).append(why(row, rule))
    return Verdicts(refused=refused, counts=counts)


def class_warnings(labels: Sequence[str | None], max_ratio: float) -> list[str]:
    """A warning naming the class whose share is far above the others' (over `max_ratio` times their median)."""
    present = [str(label) for label in labels if label is not None]
    name, ratio = class_ratio(present)
    if ratio <= max_ratio:
        return []
    share = present.count(name) / len(present)
    return [f"class '{name}' holds {share:.1%} of the texts, {ratio:.1f}x the median share of the other classes "
            f"(rule: max_class_ratio {max_ratio:g}): a model can score well by predicting it alone"]


def quarantine_texts(records: Sequence[TextRecord], refused: dict[str, list[str]], origin: str,
                     max_share: float) -> Path:
    """A copy of each refused file under its own relative name, the refused texts of a table or packaged set in
    texts.jsonl, and report.json: text -> rules."""
    folder = quarantine_folder("texts")
    lines = []
    for record in records:
        if record.name not in refused:
            continue
        if record.path is not None and record.path.is_file():
            copy = folder / "files" / record.name.lstrip("/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(record.path, copy)
        else:
            lines.append(json.dumps({"name": record.name, "label": record.label, "text": record.text,
                                     "rules": refused[record.name]}))
    if lines:
        (folder / "texts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    share = len(refused) / max(1, len(records))
    report = {"gate": "text contract", "status": "fail" if share > max_share else "warn", "origin": origin,
              "texts": len(records), "refused": len(refused), "max_bad_share": max_share,
              "texts_refused": {name: refused[name] for name in sorted(refused)}}
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return folder
