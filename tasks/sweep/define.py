"""The driver's part before any trial: the study's base params (paths made absolute: trials run elsewhere; one
thread a trial), trial 0 (the live champion's configuration, else params.yaml's), and the study created or resumed
with its definition."""
from __future__ import annotations

import copy
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tasks.config import read_params_file
from tasks.core.params_spec import Params
from tasks.core.tracking import is_uri
from tasks.registry.read import CHAMPION, alias_version, inside, refuse_climbing, registry_client
from tasks.stages.lineage import git_state
from tasks.sweep.space import check_space, enqueued, read_values, splits_fingerprint
from tasks.sweep.study import create_study, definition_of, open_storage, storage_url

BUILT_IN = ("synthetic", "sklearn:", "images:")


def study_name(params: Params) -> str:
    return params.sweep.study or f"{params.data.registered_model_name()}-sweep"


def base_params(raw: dict, params: Params, root: Path) -> dict:
    """The params every trial starts from: the project's, with the tracking store and a file source absolute (a
    trial's folder is elsewhere) and, where `train.threads` is 0, each trial's share of the cores."""
    base = copy.deepcopy(raw)
    tracking = base.setdefault("tracking", {})
    tracking["uri"] = params.tracking.resolved_uri()
    if params.tracking.artifacts and not is_uri(params.tracking.artifacts):
        tracking["artifacts"] = str((root / params.tracking.artifacts).resolve())
    source = params.data.source
    if not source.startswith(BUILT_IN) and not Path(source).is_absolute():
        base.setdefault("data", {})["source"] = str((root / source).resolve())
    if params.train.threads == 0:
        base.setdefault("train", {})["threads"] = max(1, (os.cpu_count() or 1) // params.sweep.workers)
    return base


def champion_values(params: Params, raw: dict, keys: list[str]) -> tuple[dict[str, Any], str]:
    """The searched keys' values in the live champion's params.yaml (its version's lineage), else in `raw`."""
    client = registry_client(params.tracking)
    version = alias_version(client, params.data.registered_model_name(), CHAMPION)
    if version is None or not version.run_id:
        return read_values(raw, keys), "params.yaml: no champion yet"
    try:
        refuse_climbing(client.get_run(version.run_id).info.artifact_uri, f"run {version.run_id}")
        with tempfile.TemporaryDirectory() as folder:
            file = inside(Path(folder), Path(client.download_artifacts(version.run_id, "lineage/params.yaml",
                                                                        folder)), f"run {version.run_id}")
            return read_values(read_params_file(file), keys), f"champion v{version.version}"
    except Exception as exc:   # an older version without lineage files: say so, search from params.yaml
        return read_values(raw, keys), f"params.yaml: champion v{version.version}'s params unreadable ({exc!s:.120})"


def open_study(params: Params, raw: dict, root: Path = Path(".")):
    """Create or resume the study, trial 0 queued on a new one; returns (study, its definition)."""
    settings = params.sweep
    check_space(settings.space, params)
    name = study_name(params)
    values, origin = champion_values(params, raw, list(settings.space))
    fits, held = enqueued(settings.space, values)
    definition = {"study": name, "sweep": settings.model_dump(), "base": base_params(raw, params, root),
                  "held": held, "metric": params.bless.metric, "splits": splits_fingerprint(params),
                  "started": time.time(), "origin": origin, "commit": git_state(root)["git_commit"]}
    study = create_study(name, open_storage(storage_url(root)), settings, definition)
    if not study.trials:
        study.enqueue_trial(fits, user_attrs={"role": "champion", "origin": origin})
    return study, definition_of(study)
