"""`torchship contract suggest` for a table: read the reference (nothing but what the user brought), type it
strictly, and profile every column."""
from __future__ import annotations

from tasks.modalities.interface import Suggestion
from tasks.modalities.table.contract import suggest_contract
from tasks.modalities.table.parse import parse_table
from tasks.modalities.table.sources import load_source


def suggest_table_contract(params, target: str, margin: float) -> Suggestion:
    """The proposed contract of the table `params.data.source`, labelled by `target`."""
    raw, origin = load_source(params.data, with_batches=False)   # reference data: what the user brought
    typed, kinds = parse_table(raw, target, origin)
    return Suggestion(suggest_contract(typed, kinds, target, margin=margin), origin, len(typed), "rows", [])
