"""Bad input stops with one clear paragraph, exits non-zero, and loses nothing: one run of the real CLI on a
messy file. A typo'd key, a missing file and a missing target column are refused in-process
(tests/unit/test_overrides.py, test_config.py, tests/data/test_contract.py, test_cli_inprocess.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import snapshot

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"


def _assert_untouched(project, before):
    assert snapshot(project, MODEL) == before


def test_every_problem_of_a_file_is_refused_in_one_pass(tiny_pipeline):
    """A ragged row, text in a numeric column, a mostly-numeric column and a non-UTF-8 line: one run names
    them all (column, lines, rule, count) in the console and in the quarantine's report.json."""
    project, _ = tiny_pipeline
    before = snapshot(project, MODEL)
    from tasks.modalities.table.sources import generate_customers

    table = generate_customers(400, seed=5)
    table["plan"] = np.where(np.arange(400) % 10 == 0, "gold", np.arange(400).astype(str))  # 10% text
    path = project.root / "data" / "messy.csv"
    table.to_csv(path, index=False)
    lines = path.read_bytes().split(b"\n")
    cells = lines[9].split(b",")
    cells[1] = b"twelve"                     # tenure_months on file line 10
    lines[9] = b",".join(cells)
    lines[19] = lines[19] + b",extra"        # ragged: file line 20
    lines[29] = lines[29].replace(b"north", b"n\xf6rth").replace(b"south", b"s\xf6uth")  # Latin-1: line 30
    path.write_bytes(b"\n".join(lines))
    result = project.torchship("run", "--set", "data.source=data/messy.csv", "--set", "data.target=churned")
    assert result.returncode != 0
    err = " ".join(result.stderr.split())    # rich may wrap the paragraph
    assert "column 'tenure_months' is mostly numeric" in err and "line 10: 'twelve'" in err
    assert "ragged rows" in err and "line 20: 13 fields" in err
    assert "not UTF-8" in err and "line 30" in err
    assert "column 'plan' is mostly numeric" in err and "10.0% of its 399 filled cells" in err
    assert "{type: categorical}" in err and "40 offending" in err
    assert "Traceback" not in result.stderr
    reports = list((project.root / "data" / "quarantine").glob("*-messy/report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    by_rule = {(p["column"], p["rule"].split(" (")[0]): p for p in report["problems"]}
    assert by_rule[("plan", "is mostly numeric")]["count"] == 40
    assert len(by_rule[("plan", "is mostly numeric")]["examples"]) == report["shown_per_rule"] == 5
    assert by_rule[("tenure_months", "is mostly numeric")]["examples"] == ["line 10: 'twelve'"]
    assert {None} <= {p["column"] for p in report["problems"]} and len(report["problems"]) == 4
    assert report["reasons"] == [line.removeprefix("  - ") for line in
                                 (reports[0].parent / "reason.txt").read_text().splitlines()[1:5]]
    _assert_untouched(project, before)
    path.unlink()
