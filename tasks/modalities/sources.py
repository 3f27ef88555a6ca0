"""The source, whatever its kind: which modality holds it, its label column, a check in a second before any stage
starts, and the fingerprint DVC hashes (data/source.json) so a changed source re-runs prepare."""
from __future__ import annotations

import json
from pathlib import Path

from tasks.core import paths
from tasks.core.fingerprints import batch_fingerprints
from tasks.modalities import detect_modality


def resolve_target(params) -> str:
    """The label column: the contract's when it names one, else `data.target`, else the modality's default for the
    source (a ConfigError where the source's own must be named)."""
    declared = getattr(params.contract, "target", None)
    if declared:
        return declared
    if params.data.target:
        return params.data.target
    return detect_modality(params.data, params).default_target(params.data, params)


def check_source(params) -> str:
    """Refuse now what prepare would refuse after a while; returns the label column."""
    target = resolve_target(params)
    detect_modality(params.data, params).check_source(params, target)
    return target


def fingerprint_source(params) -> dict:
    """What identifies the source's content (the modality's fingerprint), and the md5 of each accepted batch."""
    fingerprint = detect_modality(params.data, params).fingerprint(params)
    batches = batch_fingerprints()
    return {**fingerprint, "batches": batches} if batches else fingerprint


def write_source_fingerprint(params, target: Path = paths.SOURCE_FINGERPRINT) -> bool:
    """Refresh the file DVC hashes for the source, rewriting it only when it changes; True if it changed."""
    text = json.dumps(fingerprint_source(params), indent=2) + "\n"
    if target.exists() and target.read_text() == text:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return True
