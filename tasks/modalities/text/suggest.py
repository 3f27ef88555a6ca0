"""`torchship contract suggest` for texts: read every text of the reference once and profile the decodable ones
(what could not be read is named, and left out of the profile)."""
from __future__ import annotations

from pathlib import Path

from tasks.modalities.interface import Suggestion
from tasks.modalities.text.contract import suggest_text_contract
from tasks.modalities.text.sources import is_packaged, list_texts

SHOWN = 10


def suggest_contract(params, target: str, margin: float) -> Suggestion:
    """The proposed text contract of `params.data.source` (a table's text column named in it)."""
    from tasks.modalities.text.splits import source_column

    source = params.data.source
    records, origin = list_texts(source, target, params.text, params.data.seed)
    table = not (is_packaged(source) or Path(source).is_dir())
    kept = [r for r in records if r.text is not None and r.label is not None]
    skipped = [f"{r.name} ({r.error or 'no label'})" for r in records if r.text is None or r.label is None]
    notes = [f"Left out of the profile: {len(skipped)} text(s): {', '.join(skipped[:SHOWN])}"
             f"{' ...' if len(skipped) > SHOWN else ''}"] if skipped else []
    contract = suggest_text_contract([r.text for r in kept], [r.label for r in kept], margin,
                                     source_column(source, target, params.text) if table else None)
    return Suggestion(contract, origin, len(kept), "texts", notes)
