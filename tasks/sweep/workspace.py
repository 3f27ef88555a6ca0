"""Where trials run: each in a folder of its own under .sweep/<study>/ (the project's code, dvc.yaml, its own
params.yaml and dvc.lock), all sharing the project's DVC cache, so no two trials ever share a params.yaml.

The study's template is made once per machine (under a file lock: every worker there asks for it): the source
fingerprinted and `prepare` and `validate` run there, once, through DVC. A trial's folder is a copy of the template,
dvc.lock included, so DVC finds those stages unchanged and skips them (a trial whose prepare params differ runs
prepare again, and DVC's run cache may restore validate). Through a DVC remote off this disk the stages DVC can
run-cache are shared between machines too (tasks/stages/run_cache.py)."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tasks.core import paths
from tasks.core.artifacts import read_json, sha256_file, write_json_atomic
from tasks.core.errors import TorchshipError
from tasks.stages.repro import StageOutcome, reproduce
from tasks.sweep.study import SWEEP_DIR

CODE = ("tasks", "models")       # what the stages run (`python -m tasks.<stage>` imports the folder's own copy)
FILES = ("dvc.yaml", ".dvcignore")
READY = "template.json"          # written last: the template is complete
PREPARED = ("prepare", "validate")


def study_folder(root: Path, study: str) -> Path:
    """Absolute: DVC resolves a stage's paths from the folder it is given."""
    return root.resolve() / SWEEP_DIR / study


def write_params_file(path: Path, raw: dict) -> None:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    with path.open("w") as handle:
        yaml.dump(raw, handle)


def dvc_config(root: Path) -> str:
    """The project's .dvc/config for a folder elsewhere: the project's cache, no git, remote paths made absolute
    (credentials in .dvc/config.local stay there: a remote's keys come from the environment)."""
    from configobj import ConfigObj

    config = ConfigObj(str(root / ".dvc" / "config"))
    config.setdefault("core", {})["no_scm"] = "true"
    config.setdefault("cache", {})["dir"] = str((root / ".dvc" / "cache").resolve())
    for section, values in config.items():
        url = values.get("url", "") if section.startswith("remote ") else ""
        if url and "://" not in url and not os.path.isabs(url):
            values["url"] = str((root / ".dvc" / url).resolve())
    config.filename = None   # write() returns the lines instead of writing the project's file
    return "\n".join(config.write()) + "\n"


def copy_project(root: Path, folder: Path) -> None:
    """The code the stages run and dvc.yaml into `folder`, and a DVC config on the project's cache."""
    for name in CODE:
        shutil.copytree(root / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in FILES:
        if (root / name).exists():
            shutil.copy2(root / name, folder / name)
    (folder / ".dvc").mkdir()
    (folder / ".dvc" / "config").write_text(dvc_config(root))
    if (root / paths.BATCHES).is_dir():   # accepted labelled batches join prepare's data, as in the project
        shutil.copytree(root / paths.BATCHES, folder / paths.BATCHES)


def ensure_template(root: Path, study: str, base: dict, echo=sys.stdout) -> dict[str, Any]:
    """The study's template on this machine, made once: the source fingerprinted, prepare and validate run by
    DVC. Returns its record (what ran, the holdout's hash)."""
    from filelock import FileLock

    folder = study_folder(root, study) / "template"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / "template.lock")):
        if (folder / READY).exists():
            return read_json(folder / READY)
        shutil.rmtree(folder, ignore_errors=True)   # a half-made one (its maker was killed)
        folder.mkdir()
        copy_project(root, folder)
        write_params_file(folder / "params.yaml", base)
        with contextlib.chdir(folder):   # DVC's status resolves a stage's paths from the process's folder
            outcomes = [reproduce("source", echo=echo, force=True)]
            outcomes += [reproduce(stage, echo=echo) for stage in PREPARED]
        record = {"stages": {o.stage: o.status for o in outcomes if o.stage in PREPARED},
                  "holdout_sha256": sha256_file(folder / paths.HOLDOUT_SPLIT),
                  "seconds": round(sum(o.seconds for o in outcomes), 2)}
        write_json_atomic(folder / READY, record)
        return record


def trial_folder(root: Path, study: str, number: int) -> Path:
    """A fresh copy of the template for trial `number` (a leftover of a killed attempt is replaced)."""
    template = study_folder(root, study) / "template"
    folder = study_folder(root, study) / f"trial-{number}"
    if not (template / READY).exists():
        raise TorchshipError(f"the sweep study's template {template} is missing or incomplete: run `torchship sweep`.")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(template, folder, ignore=shutil.ignore_patterns("tmp", READY, "__pycache__"))
    return folder


def own_code_env(root: Path) -> dict[str, str]:
    """PYTHONPATH with the project folder after a stage's own (`python -m` in a trial's folder puts that folder, and
    its copy of tasks/ and models/, first): your own `package.module:Class` is found as in the project."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root.resolve()), os.environ.get("PYTHONPATH")]))}


def holdout_hash(folder: Path) -> str:
    return sha256_file(folder / paths.HOLDOUT_SPLIT)


def ran(outcomes: list[StageOutcome]) -> dict[str, str]:
    return {outcome.stage: outcome.status for outcome in outcomes}
