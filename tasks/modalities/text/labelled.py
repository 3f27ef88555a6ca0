"""The text batch door: labelled texts handed to `torchship ingest` (a folder of class subfolders of `.txt` files, or
a CSV or Parquet table with a text and a label column), judged text by text by the same contract as the source's,
with the trained set's classes; and the texts a retrain learns from: those ingest accepted (the request log keeps no
text by default, so feedback labels have nothing to learn from).

A batch text that is a near copy (or an exact one) of a text of the prepared splits is refused: it would leak across
splits once it joins the training set. Accepted texts are stored as one Parquet file under data/batches/
(`<time>-<name>.texts.parquet`: name, text, label), which prepare reads after the source."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core import paths
from tasks.core.artifacts import write_atomic
from tasks.core.gate import GateResult
from tasks.core.quarantine import safe_name, unique_stamp
from tasks.modalities.interface import Labelled
from tasks.modalities.text.checks import TextRules, judge_texts, metadata_table, quarantine_texts, rules_for
from tasks.modalities.text.near_duplicates import near_key, similar_keys
from tasks.modalities.text.shards import LABEL, TEXT, read_texts
from tasks.modalities.text.sources import TextRecord, folder_texts, table_texts

SUFFIX = ".texts.parquet"
STAMP = "%Y%m%d-%H%M%S"   # tasks/core/quarantine.py unique_stamp's time part
GATE = "text batch"
LEAK_RULE = "not a copy or near copy of a text in the prepared splits (leakage across splits)"


def batch_texts(path: Path, params, schema) -> list[TextRecord]:
    """The labelled texts of a batch: a folder of class subfolders, or a table with the model's text column."""
    if path.is_dir():
        return folder_texts(path, params.text.max_chars)
    column = getattr(params.contract, "text_column", None) or params.text.text_column
    return table_texts(path, schema.target, column or schema.inputs.get("column"), params.text.max_chars)


def prepared_keys() -> dict[str, str]:
    """near key -> `name (split)` of every prepared text (what a batch text must not repeat, near or exactly)."""
    from tasks.modalities.text.shards import read_metadata

    held = {}
    for split, path in (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT)):
        if path.exists():
            names = read_metadata(path)["name"].astype(str)
            held.update({near_key(text): f"{name} ({split})" for text, name in zip(read_texts(path), names)})
    return held


def leaks(records: list[TextRecord], held: dict[str, str], threshold: float) -> dict[str, list[str]]:
    """Batch text name -> the leakage rule, for each text whose near key equals or resembles a prepared text's."""
    keys = {r.name: near_key(r.text) for r in records if r.text is not None}
    found: dict[str, list[str]] = {}
    for name, key in keys.items():
        if key and key in held:
            found[name] = [f"{LEAK_RULE}: the same text as {held[key]}"]
    if not keys or not held:
        return found
    prepared = list(held)
    batch = [(name, key) for name, key in keys.items() if key and name not in found]
    candidates = prepared + [key for _, key in batch]
    for a, b, jaccard in similar_keys(candidates, threshold):
        if a < len(prepared) <= b:   # one prepared text and one batch text
            name = batch[b - len(prepared)][0]
            found.setdefault(name, [f"{LEAK_RULE}: near {held[prepared[a]]}, Jaccard {jaccard:.2f}"])
    return found


def judge_text_batch(records: list[TextRecord], origin: str, rules: TextRules
                     ) -> tuple[GateResult, list[TextRecord], dict[str, list[str]]]:
    """(the gate, the accepted records, refused name -> rules): the source's per-text rules, and no leak into the
    prepared splits; it fails when the refused share is over max_bad_share, or every text is refused."""
    if not records:
        return GateResult(gate=GATE, status="fail", reasons=[f"{origin} holds no texts"]), [], {}
    refused = judge_texts(metadata_table(records), rules).refused
    for name, rule in leaks(records, prepared_keys(), rules.near_duplicate_jaccard).items():
        refused.setdefault(name, []).extend(rule)
    share = len(refused) / len(records)
    reasons = [f"{name}: {'; '.join(broken)}" for name, broken in sorted(refused.items())]
    if share > rules.max_bad_share or len(refused) == len(records):
        gate = GateResult.decide(GATE, [f"{len(refused)} of {len(records)} texts refused ({share:.1%}), over "
                                        f"max_bad_share {rules.max_bad_share:.0%}", *reasons])
    else:
        gate = GateResult.decide(GATE, [], reasons, passed=f"{len(records)} of {len(records)} texts accepted")
    return gate, [r for r in records if r.name not in refused], refused


def write_text_batch(records: list[TextRecord], name: str) -> Path:
    """The accepted texts and labels as one file under data/batches/ (temp + rename)."""
    frame = pd.DataFrame({"name": [r.name for r in records], TEXT: [r.text for r in records],
                          LABEL: [r.label for r in records]})
    accepted = paths.BATCHES / f"{unique_stamp()}-{safe_name(name)}{SUFFIX}"
    write_atomic(accepted, lambda tmp: frame.to_parquet(tmp, index=False))
    return accepted


def ingest_verdict(path: Path, params, schema) -> Labelled:
    """Refused texts are kept in quarantine with the report; within the share the rest may join data/batches/,
    else the whole batch is refused (the batch stays where it is)."""
    from tasks.modalities.text.contract import TextContract

    contract = params.contract if isinstance(params.contract, TextContract) else None
    records = batch_texts(path, params, schema)
    rules = rules_for([r.label for r in records], params.text, contract)
    rules = dataclasses.replace(rules, classes=list(schema.classes))
    gate, accepted, refused = judge_text_batch(records, str(path), rules)
    quarantine = None
    if refused:
        folder = quarantine_texts(records, refused, str(path), rules.max_bad_share)
        gate, quarantine = gate.model_copy(update={"evidence": str(folder / "report.json")}), str(folder)
    store = None if gate.blocks(params.validate_.warn_blocks) else (lambda: write_text_batch(accepted, path.stem))
    return Labelled(gate=gate, offered=len(records), accepted=len(accepted) if store else 0,
                    quarantined=len(refused), store=store, quarantine=quarantine)


def accepted_at(path: Path) -> float:
    """When a batch was accepted: the local time in its name (what a retrain's high-water mark compares)."""
    try:
        return time.mktime(time.strptime(path.name[:15], STAMP))
    except ValueError:
        return path.stat().st_mtime


def batch_files() -> list[Path]:
    return sorted(paths.BATCHES.glob(f"*{SUFFIX}"))


def batch_records(max_chars: int) -> list[TextRecord]:
    """Every text of the accepted batches, named `<batch>/<name>`, read again as the source's are (prepare)."""
    from tasks.modalities.text.sources import inspect_text

    found = []
    for path in batch_files():
        frame = pd.read_parquet(path)
        stem = path.name.removesuffix(SUFFIX)
        found += [inspect_text(f"{stem}/{name}", str(text), max_chars, str(label))
                  for name, text, label in zip(frame["name"], frame[TEXT], frame[LABEL])]
    return found


def ingested_times() -> list[float]:
    """When each text `torchship ingest` accepted arrived."""
    times: list[float] = []
    for path in batch_files():
        times += [accepted_at(path)] * len(pd.read_parquet(path, columns=["name"]))
    return times


def ingested_batch(since: float, until: float) -> Labelled:
    """The texts `torchship ingest` accepted in (since, until] (already judged at the door, in data/batches/)."""
    batches = [p for p in batch_files() if since < accepted_at(p) <= until]
    texts = int(np.sum([len(pd.read_parquet(p, columns=["name"])) for p in batches]))
    if not batches:
        gate = GateResult(gate=GATE, status="fail", reasons=[
            "no labelled texts were ingested since the last retrain: a text model learns from the texts "
            "`torchship ingest PATH` accepts (the request log keeps no text by default)"])
        return Labelled(gate=gate, offered=0, accepted=0, quarantined=0, store=None)
    gate = GateResult(gate=GATE, status="pass",
                      reasons=[f"{texts} labelled texts in {len(batches)} ingested batch(es)"])
    return Labelled(gate=gate, offered=texts, accepted=texts, quarantined=0, store=lambda: batches[-1])
