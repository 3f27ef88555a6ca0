"""Every problem a refused table has, found in one pass: a refusal lists them all (column, lines, rule, count),
so a user fixes the file once instead of learning of each problem one re-run at a time."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tasks.core.errors import DataError

SHOWN = 5  # example lines named per rule; the count is always the full one


@dataclass(frozen=True)
class Problem:
    """One rule broken somewhere in a table: where (column or the whole file), which lines, how often."""

    rule: str                       # what is wrong and the rule, e.g. "must be numeric (rule: ...)"
    count: int                      # how many rows/cells break it (all of them, not only those shown)
    column: str | None = None       # None: the file or a row as a whole
    examples: list[str] = field(default_factory=list)  # up to SHOWN, e.g. "line 9: 'twelve'"
    fix: str = ""                   # what to do about it

    def sentence(self) -> str:
        where = f"column '{self.column}'" if self.column is not None else "the file"
        shown = f" ({', '.join(self.examples)}{', ...' if self.count > len(self.examples) else ''})" \
            if self.examples else ""
        return f"{where} {self.rule}: {self.count} offending{shown}." + (f" {self.fix}" if self.fix else "")

    def as_dict(self) -> dict:
        return asdict(self)


def line_examples(cells, limit: int = SHOWN) -> list[str]:
    """`line N: 'value'` for the first `limit` (line, value) pairs; a line may be a batch row's name."""
    return [f"{_where(line)}: {value!r}" for line, value in list(cells)[:limit]]


def _where(line) -> str:
    return f"line {line}" if isinstance(line, int) or str(line).isdigit() else str(line)


class DataProblems(DataError):
    """A refusal that carries every problem found; its message lists them one per line."""

    def __init__(self, origin: str, problems: list[Problem]):
        self.origin, self.problems = origin, list(problems)
        lines = [f"{origin}: {len(self.problems)} problem(s) found (each shows at most {SHOWN} lines; "
                 "fix them all before re-running):"] + [f"  - {p.sentence()}" for p in self.problems]
        super().__init__("\n".join(lines))

    def report(self) -> dict:
        """The refusal as the gate's JSON: one reason per problem, plus the structured problems."""
        return {"gate": "data contract", "status": "fail", "reasons": [p.sentence() for p in self.problems],
                "origin": self.origin, "shown_per_rule": SHOWN, "problems": [p.as_dict() for p in self.problems]}


def raise_if_any(origin: str, problems: list[Problem]) -> None:
    if problems:
        raise DataProblems(origin, problems)
