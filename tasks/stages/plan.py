"""`torchship plan`: which DVC stages a run with these overrides would re-run, and why. Nothing runs and
every file it touches to ask DVC is put back."""
from __future__ import annotations

from pydantic import BaseModel

from tasks.modalities.sources import write_source_fingerprint
from tasks.stages.overrides import applied_overrides, resolve
from tasks.stages.repro import stage_changes
from tasks.stages.stage_list import PREFECT_STEPS, dvc_stages


class PlannedStep(BaseModel):
    step: str
    would: str      # run | maybe run | skip
    why: str


def plan_steps(stages: list[str], changes: dict[str, list[str]]) -> list[PlannedStep]:
    """Pure core: dvc.yaml's stages and DVC's reasons per stage -> one row per step of the pipeline, in order."""
    rows, upstream_runs = [], False
    for stage in stages:
        reasons = changes.get(stage)
        if reasons:
            rows.append(PlannedStep(step=stage, would="run", why="; ".join(reasons)))
            upstream_runs = True
        elif upstream_runs:
            rows.append(PlannedStep(step=stage, would="maybe run", why="if an upstream stage's outputs change"))
        else:
            rows.append(PlannedStep(step=stage, would="skip", why="deps, params and outs unchanged"))
    rows += [PlannedStep(step=step.name, would="run", why="compares with the live registry every run")
             for step in PREFECT_STEPS]
    return rows


def plan_run(assignments: list[str], params_file: str | None) -> list[PlannedStep]:
    """Apply the overrides for a look, refresh the source's fingerprint, ask DVC, and put params.yaml and the
    fingerprint back."""
    raw, parsed = resolve(assignments, params_file)
    with applied_overrides(raw, keep=False):
        write_source_fingerprint(parsed)
        return plan_steps(dvc_stages(), stage_changes())
