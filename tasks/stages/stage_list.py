"""The one list of stages: dvc.yaml's, and after them the Prefect-only steps, declared here once. Everything that
lists steps derives from it: the flow's order, each stage's folder and metrics file, the summary's headlines,
`torchship plan` and `clean`, and the diagram and step table of the docs (tasks/stages/diagram.py).

A stage's headline is the `headline` key (one line of text) of its first `metrics:` file in dvc.yaml; what that
line says is the stage's `meta: {headline: ...}`, and what the stage does, in a few words, its `desc:`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.core import paths
from tasks.core.artifacts import read_json
from tasks.core.dvc_file import read_dvc_file

HEADLINE = "headline"   # the key of a stage's metrics file that its summary row shows
# Always changed for DVC (it fingerprints the source for plain `dvc repro`); torchship's run and plan write
# that fingerprint themselves first, so for them it is never a reason to run anything.
REFRESHED_BY_TORCHSHIP = ("source",)


@dataclass(frozen=True)
class Step:
    """One step as the docs and the summary show it."""

    name: str
    does: str                       # a few words: the diagram's caption (dvc.yaml `desc:`)
    headline: str = ""              # what its summary row says (dvc.yaml `meta: {headline: ...}`)
    statuses: str = "ran / skipped"
    metrics: tuple[str, ...] = ()   # its metrics files (dvc.yaml `metrics:`): the first holds the headline


# After the DVC stages, one call each in the flow: they compare with the live registry and service, so they are
# recomputed every run (DVC caches what depends only on files and params).
PREFECT_STEPS = (
    Step("bless", "vs live champion, baselines, SLO",
         "quality (vs the baselines and the live champion), performance and service stages", "pass / warn / fail"),
    Step("register", "MLflow aliases, history, lineage", "the version and the aliases it moved",
         "new version / reused"),
    Step("canary", "shadow, steps, analysis, rollback",
         "the progressive canary of the challenger, or the champion's check when there is no challenger",
         "pass / fail / …"),
)
SERVE = Step("serve", "champion + challenger, metrics, request log")   # where the steps lead: the service


def entry_path(entry) -> str:
    """A dvc.yaml out or metric is either 'path' or {'path': {options}}."""
    return entry if isinstance(entry, str) else next(iter(entry))


def read_dvc_stages(root: Path = Path(".")) -> dict:
    """dvc.yaml's `stages` mapping."""
    return read_dvc_file(root)["stages"]


def dvc_steps(root: Path = Path(".")) -> list[Step]:
    """dvc.yaml's stages, in order."""
    return [Step(name, stage.get("desc", ""), (stage.get("meta") or {}).get("headline", ""),
                 metrics=tuple(entry_path(entry) for entry in stage.get("metrics", [])))
            for name, stage in read_dvc_stages(root).items()]


def dvc_stages(root: Path = Path(".")) -> list[str]:
    """dvc.yaml's stage names, in order."""
    return [step.name for step in dvc_steps(root)]


def pipeline_stages(root: Path = Path(".")) -> list[str]:
    """The stages the pipeline runs through `dvc repro`, in order: all but the ones torchship refreshes itself."""
    return [stage for stage in dvc_stages(root) if stage not in REFRESHED_BY_TORCHSHIP]


def summary_steps(root: Path = Path(".")) -> list[Step]:
    """The rows of a run's summary, in order: the stages the pipeline runs, then the Prefect-only steps."""
    return [step for step in dvc_steps(root) if step.name not in REFRESHED_BY_TORCHSHIP] + list(PREFECT_STEPS)


def stage_folder(stage: str) -> Path:
    """data/<stage>/: where a stage writes (the source stage writes data/source.json only)."""
    return paths.DATA / stage


def metrics_file(stage: str, root: Path = Path(".")) -> Path | None:
    """The stage's first `metrics:` file in dvc.yaml, the one holding its headline; None when it declares none."""
    metrics = next(step.metrics for step in dvc_steps(root) if step.name == stage)
    return Path(metrics[0]) if metrics else None


def metrics_files(root: Path = Path(".")) -> list[Path]:
    """Every stage's metrics files (DVC does not cache them: a failed run puts them back itself)."""
    return [Path(path) for step in dvc_steps(root) for path in step.metrics]


def headline(stage: str, cwd: Path = Path(".")) -> str:
    """The `headline` of the stage's metrics file, "" before it has one."""
    path = metrics_file(stage, cwd)
    if path is None or not (cwd / path).exists():
        return ""
    return str(read_json(cwd / path).get(HEADLINE, ""))
