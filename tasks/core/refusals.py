"""What a request is refused with, by every modality's request decoder and the service: a body that is no
request at all (400 or 422), or rows or items that break the model's schema (422, naming row, field and rule);
and the one way items are checked by a pydantic model into such problems."""
from __future__ import annotations

from pydantic import BaseModel, TypeAdapter, ValidationError


class BodyRefused(ValueError):
    """A body that is not a request at all: not JSON (400, in the parser's own words: where it stopped and
    why), or JSON of another shape (422)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class RowsRefused(ValueError):
    """Request rows that break the model's schema; `problems` name row, field and rule."""

    def __init__(self, problems: list[dict]):
        super().__init__(f"{len(problems)} problem(s) in the request rows")
        self.problems = problems


def validate_rows(row_type: type[BaseModel], rows: list) -> list[dict]:
    """One problem per bad (row, field): {row, field, rule, message}; empty when every row is valid."""
    try:
        TypeAdapter(list[row_type]).validate_python(rows)
    except ValidationError as exc:
        # A union type reports once per member: one line per column is enough, and the member whose type matched
        # (a too-large integer for a text-or-integer category) says more than the one that did not.
        chosen: dict[tuple, dict] = {}
        for error in exc.errors():
            index, *rest = error["loc"]
            key = (index, str(rest[0]) if rest else "(row)")
            if key not in chosen or (chosen[key]["type"].endswith("_type") and not error["type"].endswith("_type")):
                chosen[key] = error
        problems = [{"row": index, "field": column, "rule": error["type"], "message": error["msg"]}
                    for (index, column), error in chosen.items()]
        return problems
    return []
