"""The per-text rules (tasks/modalities/text/checks.py) as one Great Expectations suite over the metadata table: the
same verdicts as the pandas pass, plus GX's own result rows and Data Docs for the report. Near copies across splits
are found in pandas (MinHash, tasks/modalities/text/near_duplicates.py) and judged here as a column that must be
empty, so every finding lands in the same report."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from tasks.modalities.text.checks import Rule, TextRules, Verdicts, per_text_rules, why


def expectation_of(rule: Rule):
    """The GX expectation that checks `rule`."""
    import great_expectations.expectations as gxe

    if rule.null is not None:
        kind = gxe.ExpectColumnValuesToBeNull if rule.null else gxe.ExpectColumnValuesToNotBeNull
        return kind(column=rule.column)
    if rule.allowed is not None:
        return gxe.ExpectColumnValuesToBeInSet(column=rule.column, value_set=list(rule.allowed))
    return gxe.ExpectColumnValuesToBeBetween(column=rule.column, min_value=rule.low, max_value=rule.high)


def judge_texts_gx(table: pd.DataFrame, rules: TextRules, docs_dir: Path | None = None
                   ) -> tuple[Verdicts, list[dict]]:
    """GX over the metadata table, every text and rule in one validation: the verdicts (as `judge_texts` gives
    them) and one result row per expectation (rule, success, unexpected count, a sample of names)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.execution_engine import pandas_execution_engine

    pandas_execution_engine.HASH_THRESHOLD = 0   # a batch fingerprint never read, costlier than the checks
    suite_rules = per_text_rules(rules)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = context.data_sources.add_pandas(name="torchship-texts").add_dataframe_asset(name="texts") \
        .add_batch_definition_whole_dataframe("all")
    suite = context.suites.add(gx.ExpectationSuite(name="texts",
                                                   expectations=[expectation_of(r) for r in suite_rules]))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="texts", data=batch, suite=suite))
    result_format = {"result_format": "COMPLETE", "unexpected_index_column_names": ["name"]}
    results = definition.run(batch_parameters={"dataframe": table}, result_format=result_format).results
    by_key = {(r.expectation_config.type, r.expectation_config.kwargs.get("column")): r for r in results}
    rows_by_name = table.set_index("name", drop=False)
    refused: dict[str, list[str]] = {}
    counts, report = {}, []
    for rule in suite_rules:
        check = by_key[(expectation_of(rule).expectation_type, rule.column)]
        names = [str(row["name"]) for row in check.result.get("unexpected_index_list") or []]
        counts[rule.words] = len(names)
        for name in names:
            refused.setdefault(name, []).append(why(rows_by_name.loc[name], rule))
        report.append({"expectation": check.expectation_config.type, "rule": rule.words, "column": rule.column,
                       "success": bool(check.success), "unexpected_count": len(names), "sample": names[:3]})
    if docs_dir is not None:
        site = Path(context.build_data_docs()["local_site"].removeprefix("file://")).parent
        shutil.rmtree(docs_dir, ignore_errors=True)
        shutil.copytree(site, docs_dir)
    return Verdicts(refused=refused, counts=counts), report
