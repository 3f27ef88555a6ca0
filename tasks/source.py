"""source: fingerprint the raw data (the file's md5, or a built-in source's spec, plus each accepted batch)
into data/source.json, the file prepare depends on, so plain `dvc repro` sees an edited source.

DVC stage: `python -m tasks.source` (always run: hashing is cheap; data/source.json is rewritten only when it
changes, and only then does prepare re-run). `torchship run` and `torchship plan` refresh it themselves.
"""
from __future__ import annotations

import logging

from tasks.core import paths
from tasks.core.params_spec import Params
from tasks.modalities.sources import write_source_fingerprint
from tasks.stages.entry import stage_main

log = logging.getLogger("torchship.source")


def run(params: Params) -> None:
    """DVC stage body: refresh the fingerprint."""
    changed = write_source_fingerprint(params)
    log.info("%s: %s", paths.SOURCE_FINGERPRINT, "changed: prepare re-runs" if changed else "unchanged")


if __name__ == "__main__":
    stage_main("source", run)
