"""prepare for texts: judge every text once by the text contract, quarantine the refused ones with the report,
split the rest stratified, by a seeded hash of each text, with near duplicates kept together, and fit the run's
tokenizer on the training split (or, starting from a pretrained text encoder, take the one its checkpoint carries).

One pass names every bad text with every rule it breaks (tasks/modalities/text/checks.py). The run goes on when the
refused share is within `max_bad_share` (the contract's, else `text.max_bad_share`); above it nothing is written and
prepare fails. Either way every refused text is kept in data/quarantine/ with report.json: nothing is lost.

Near duplicates (word-pair Jaccard at least `near_duplicate_jaccard`, chains included) form one group, and a group
is split as one item: a near copy of a holdout text never sits in the training split, so the holdout measures what
the model was not shown. A group's place in its class comes from a hash of its own text, so texts that join the set
later never move an earlier one from training into the holdout. The tokenizer sees the training texts only."""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.labels import class_labels, label_strings
from tasks.core.params_spec import PrepareParams
from tasks.core.schema_spec import Schema
from tasks.modalities.text.checks import (
    TextRules,
    class_warnings,
    judge_texts,
    metadata_table,
    quarantine_texts,
    rules_for,
)
from tasks.modalities.text.contract import TextContract
from tasks.modalities.text.inputs import text_inputs
from tasks.modalities.text.near_duplicates import near_duplicate_groups
from tasks.modalities.text.settings import TextParams
from tasks.modalities.text.shards import LABEL, METADATA, TEXT
from tasks.modalities.text.sources import TextRecord
from tasks.modalities.text.tokenizer import Tokenizer, fit_tokenizer

log = logging.getLogger("torchship.prepare")
SHOWN_TEXTS = 20   # refused texts named in the message (report.json names every one)
SPLITS = ("train", "val", "holdout")


@dataclass(frozen=True)
class PreparedTexts:
    schema: Schema
    splits: dict[str, pd.DataFrame]      # per split: name, text, label and the measured metadata
    refused: dict[str, list[str]]        # text name -> every rule it breaks
    rules: TextRules
    texts: int                           # in the source
    tokenizer: Tokenizer


def listing(refused: dict[str, list[str]]) -> str:
    """The first SHOWN_TEXTS refused texts with their rules, one a line (and how many more report.json names)."""
    lines = [f"  - {name}: {'; '.join(rules)}" for name, rules in sorted(refused.items())[:SHOWN_TEXTS]]
    more = len(refused) - SHOWN_TEXTS
    return "\n".join(lines + ([f"  ... and {more} more (report.json names every one)"] if more > 0 else []))


def judged(records: list[TextRecord], origin: str, rules: TextRules) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """(the metadata table, refused name -> rules) of one pass; refused texts are quarantined, and above
    `max_bad_share` prepare fails (DataError) after quarantining them."""
    table = metadata_table(records)
    refused = judge_texts(table, rules).refused
    for warning in class_warnings([r.label for r in records], rules.max_class_ratio):
        log.warning("%s: %s", origin, warning)
    if refused:
        folder = quarantine_texts(records, refused, origin, rules.max_bad_share)
        share = len(refused) / len(records)
        if share > rules.max_bad_share:
            raise DataError(f"{origin}: {len(refused)} of {len(records)} texts ({share:.1%}) break the text contract, "
                            f"over the {rules.max_bad_share:.0%} it allows (max_bad_share): nothing was prepared. Fix "
                            f"or remove them, or raise the share in the contract.\n{listing(refused)}\n"
                            f"Every refused text and this report are in {folder}/.")
        log.warning("%s: %d of %d texts refused (%.1f%%, within max_bad_share %.0f%%) and quarantined in %s/:\n%s",
                    origin, len(refused), len(records), 100 * share, 100 * rules.max_bad_share, folder,
                    listing(refused))
    return table, refused


def stable_draw(text: str, seed: int) -> float:
    """A seeded hash of a text as a number in [0, 1): where it falls, whatever other texts the set holds."""
    digest = hashlib.sha256(f"{seed}\0{text}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def split_groups(labels: pd.Series, texts: pd.Series, groups: np.ndarray, params: PrepareParams,
                 origin: str) -> np.ndarray:
    """Each text's split ("train", "val", "holdout"): groups of near duplicates are split as one item, stratified by
    the label of their first text. Within a class the groups rank by a seeded hash of their first text: the lowest
    `holdout_fraction` go to the holdout, the next `val_fraction` to validation, the rest to training. So texts that
    join the set (a retrain's ingested texts) move the earlier ones at most across the edges of the validation band,
    never from training into the holdout: the holdout a retrain and its champion are compared on holds no text the
    champion was trained on (a random re-split hands it a third of them)."""
    first = pd.Series(np.arange(len(groups))).groupby(groups).min()          # group id -> its first text
    group_labels = labels.iloc[first.to_numpy()].to_numpy()
    draws = np.array([stable_draw(texts.iloc[i], params.seed) for i in first.to_numpy()])
    named = np.full(len(first), "train", dtype=object)
    for label in np.unique(group_labels):
        ranked = np.flatnonzero(group_labels == label)
        ranked = ranked[np.argsort(draws[ranked], kind="stable")]
        holdout = max(1, round(params.holdout_fraction * len(ranked)))
        val = max(1, round(params.val_fraction * len(ranked)))
        if holdout + val >= len(ranked):
            raise DataError(f"{origin}: class '{label}' has only {len(ranked)} text(s) (near copies counted once), "
                            "too few to appear in train, validation and holdout. Add texts, merge rare classes, or "
                            "lower prepare.val_fraction / prepare.holdout_fraction.")
        named[ranked[:holdout]], named[ranked[holdout:holdout + val]] = "holdout", "val"
    by_group = dict(zip(first.index, named))
    return np.array([by_group[g] for g in groups], dtype=object)


def prepare_texts(records: list[TextRecord], origin: str, target: str, column: str, params: TextParams,
                  split: PrepareParams, contract: TextContract | None = None,
                  pretrained: Tokenizer | None = None) -> PreparedTexts:
    """The core: judge, quarantine, split (near copies together), fit the tokenizer on the training texts (or take
    a `pretrained` encoder's own: its ids must mean what they meant in pretraining). Raises DataError (after
    quarantining) when the refused share is over the limit or a class is too small to split."""
    if not records:
        raise DataError(f"{origin} holds no texts")
    rules = rules_for([r.label for r in records], params, contract)
    table, refused = judged(records, origin, rules)
    kept = table[~table["name"].isin(refused)].reset_index(drop=True)
    if len(kept) < rules.min_texts:
        raise DataError(f"{origin}: {len(kept)} texts pass the contract, fewer than its min_texts {rules.min_texts}.")
    by_name = {r.name: r.text for r in records}
    kept[TEXT] = [by_name[name] for name in kept["name"]]
    kept[LABEL] = label_strings(kept[LABEL])
    groups = near_duplicate_groups(kept[TEXT].tolist(), rules.near_duplicate_jaccard, split.seed)
    assignment = split_groups(kept[LABEL], kept[TEXT], groups, split, origin)
    splits = {name: kept[assignment == name][["name", TEXT, LABEL, *METADATA[1:]]].reset_index(drop=True)
              for name in SPLITS}
    settings = params.tokenizer
    tokenizer = pretrained or fit_tokenizer(splits["train"][TEXT], settings.tokens_per_text, settings.lowercase,
                                            settings.min_count, settings.max_vocab, settings.gram_settings())
    schema = Schema(source=origin, target=target, classes=class_labels(kept[LABEL]), modality="text",
                    inputs=text_inputs(tokenizer, column, rules.chars[1]))
    return PreparedTexts(schema=schema, splits=splits, refused=refused, rules=rules, texts=len(records),
                         tokenizer=tokenizer)
