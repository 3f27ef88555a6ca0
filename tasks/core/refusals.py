"""What a request is refused with, by every modality's request decoder and the service: a body that is no
request at all (400 or 422), or rows or items that break the model's schema (422, naming row, field and rule)."""
from __future__ import annotations


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
