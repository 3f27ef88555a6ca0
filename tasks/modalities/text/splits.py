"""The prepared text splits on disk: one shard file per split (tasks/modalities/text/shards.py), the schema (with the
tokenizer inside) and prepare's metrics, written atomically; and the validate stage's gate on them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from tasks.core import paths
from tasks.core.artifacts import write_atomic, write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.schema_spec import Schema
from tasks.modalities.text.checks import class_warnings, metadata_table, rules_for
from tasks.modalities.text.contract import TextContract
from tasks.modalities.text.inputs import text_shape
from tasks.modalities.text.prepare import PreparedTexts, listing, prepare_texts
from tasks.modalities.text.shards import LABEL, TEXT, read_metadata, read_texts, write_split
from tasks.modalities.text.sources import TextRecord, is_packaged, list_texts, read_table, text_column_of

SPLIT_PATHS = (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT))


def declared(params) -> TextContract | None:
    return params.contract if isinstance(params.contract, TextContract) else None


def text_settings(params):
    """The `text` params as the contract amends them: its character limit (texts are read within it), and its text
    column where it names one."""
    contract = declared(params)
    if contract is None:
        return params.text
    return params.text.model_copy(update={"max_chars": contract.max_chars,
                                          "text_column": contract.text_column or params.text.text_column})


def source_column(source: str, target: str, settings) -> str:
    """The raw column a model reads: a table's text column (named, else detected), else `text`."""
    path = Path(source)
    if is_packaged(source) or path.is_dir():
        return TEXT
    return text_column_of(read_table(path, sample=True), target, settings.text_column, source)


def write_prepared_texts(prepared: PreparedTexts, tokenizer_from: str = "fitted on the training split") -> dict:
    """Write the text splits (one shard file each), the schema and the headline figures atomically."""
    for name, path in SPLIT_PATHS:
        write_split(path, prepared.splits[name])
    write_atomic(paths.SCHEMA, lambda tmp: tmp.write_text(prepared.schema.to_json()))
    train = prepared.splits["train"]
    rows = {name: len(frame) for name, frame in prepared.splits.items()}
    tokenizer, shape = prepared.tokenizer, text_shape(prepared.schema)
    counted = [len(tokenizer.tokens(text, shape.max_tokens + 1)) for text in train[TEXT]]
    truncated = sum(count > shape.max_tokens for count in counted) / max(1, len(counted))
    metrics = {"modality": "text", "rows": rows, "texts": prepared.texts, "refused": len(prepared.refused),
               "column": shape.column, "vocabulary": shape.vocab_size, "tokens_per_text": shape.max_tokens,
               "char_grams": len(tokenizer.grams.vocabulary) if tokenizer.grams else 0, "gram_slots": shape.gram_slots,
               "lowercase": shape.lowercase, "tokenizer_sha256": shape.tokenizer_sha256, "tokenizer": tokenizer_from,
               "truncated_share": round(truncated, 4), "classes": len(prepared.schema.classes),
               "class_share": {str(k): round(float(v), 4) for k, v in
                               train[LABEL].value_counts(normalize=True).sort_index().items()},
               "headline": f"{sum(rows.values()):,} texts, {len(prepared.schema.classes)} classes, a tokenizer of "
                           f"{shape.vocab_size:,} ids {tokenizer_from.split(',')[0]} ({shape.max_tokens} a text, "
                           f"{truncated:.0%} of training texts "
                           "truncated)" + (f", {len(prepared.refused)} refused (quarantined)" if prepared.refused
                                           else "")}
    write_json_atomic(paths.PREPARE_METRICS, metrics)
    return metrics


def prepare_source(params, target: str) -> dict:
    """The stage's text body: read, judge, quarantine, split, fit the tokenizer (or take a pretrained encoder's),
    write."""
    from tasks.modalities.text.labelled import batch_records
    from tasks.modalities.text.pretrained import pretrained_tokenizer

    settings = text_settings(params)
    pretrained = pretrained_tokenizer(params.train.pretrained)
    records, origin = list_texts(params.data.source, target, settings, params.data.seed, params.data.drift)
    accepted = batch_records(settings.max_chars)   # labelled texts `torchship ingest` accepted
    if accepted:
        records, origin = records + accepted, f"{origin} + {len(accepted)} accepted batch text(s)"
    column = source_column(params.data.source, target, settings)
    prepared = prepare_texts(records, origin, target, column, settings, params.prepare, declared(params), pretrained)
    return write_prepared_texts(prepared, f"pretrained, beside {params.train.pretrained.path}" if pretrained
                                else "fitted on the training split")


def split_records(schema: Schema) -> tuple[list[TextRecord], list[str]]:
    """Every prepared text as a record, and its split."""
    records, splits = [], []
    for split, path in SPLIT_PATHS:
        metadata = read_metadata(path)
        for name, text, label in zip(metadata["name"], read_texts(path), metadata[LABEL]):
            records.append(TextRecord(str(name), str(label), text, len(text.encode("utf-8", "surrogatepass"))))
            splits.append(split)
    return records, splits


def validate_prepared(params, schema: Schema) -> tuple[GateResult, list[dict]]:
    """The text contract's suite (Great Expectations) on the written splits' metadata table: every per-text rule on
    every split, no near copy of a text in an earlier split, the training split's size and class shares."""
    from tasks.modalities.text.expectations import judge_texts_gx

    records, splits = split_records(schema)
    rules = rules_for([r.label for r in records], text_settings(params), declared(params))
    if declared(params) is None:   # without a contract, the trained classes are the set
        rules = dataclasses.replace(rules, classes=list(schema.classes))
    table = metadata_table(records, splits, rules.near_duplicate_jaccard)
    verdicts, rows = judge_texts_gx(table, rules, docs_dir=paths.DATA_DOCS)
    rows = [{"split": "all splits", **row} for row in rows]
    failures, warnings = [], []
    if verdicts.refused:
        failures.append(f"{len(verdicts.refused)} prepared text(s) break the text contract:\n"
                        f"{listing(verdicts.refused)}")
    train = pd.Series([r.label for r, s in zip(records, splits) if s == "train"])
    minimum = params.validate_.min_rows
    rows.append({"split": "train", "expectation": "min_rows", "rule": f"at least {minimum} training texts",
                 "column": None, "success": len(train) >= minimum, "unexpected_count": 0, "sample": []})
    if len(train) < minimum:
        failures.append(f"train: {len(train)} texts, fewer than validate.min_rows {minimum}")
    shares = train.value_counts(normalize=True)
    failures += [f"train: class '{c}' holds {shares.get(c, 0.0):.3f} of the texts (rule: min_class_share "
                 f"{rules.min_class_share})" for c in rules.classes if shares.get(c, 0.0) < rules.min_class_share]
    warnings += class_warnings(train.tolist(), rules.max_class_ratio)
    return GateResult.decide("text contract", failures, warnings, evidence=str(paths.DATA_DOCS / "index.html"),
                             passed=f"{len(rows)} expectations passed on {len(records):,} texts"), rows
