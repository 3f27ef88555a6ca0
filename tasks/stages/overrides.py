"""`--params` / `--set key=value` overrides, validated first and then written into params.yaml
(as `dvc exp run -S` does) so DVC sees exactly what the code runs with."""
from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.config import PARAMS_FILE, parse_params, read_params_file
from tasks.core import paths
from tasks.core.artifacts import write_bytes_atomic
from tasks.core.errors import ConfigError
from tasks.core.params_spec import AUTO, Params
from tasks.core.procs import sigterm_raises


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """'train.epochs=30' -> (['train', 'epochs'], 30); values are YAML (30, 0.5, null, [64, 32], text)."""
    from ruamel.yaml import YAML

    if "=" not in text:
        raise ConfigError(f"--set {text!r} is not key=value (example: --set train.epochs=30).")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if len(path) < 2:
        raise ConfigError(f"--set {text!r}: give section.key (example: --set train.epochs=30).")
    try:
        value = YAML(typ="safe").load(raw) if raw.strip() else None
    except Exception as exc:  # ruamel has many parser error types
        raise ConfigError(f"--set {text!r}: the value is not valid YAML ({str(exc).splitlines()[0]}); "
                          "quote it or fix the brackets (example: --set train.hidden=[64,32]).") from None
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        value = raw  # "Segment: 2026" is a column name, not a mapping
    return path, value


def merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        both_dicts = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = merge(merged[key], value) if both_dicts else value
    return merged


def resolve(assignments: list[str], params_file: str | None = None,
            base_file: str = PARAMS_FILE) -> tuple[dict, Params]:
    """The merged raw mapping and its validated Params; nothing is written, and no code of the user's runs (the own
    module's probe is `torchship run`'s, in a child process: tasks/training/probe_process.py)."""
    raw = read_params_file(base_file)
    if params_file:
        raw = merge(raw, read_params_file(params_file))
    for text in assignments:
        path, value = parse_assignment(text)
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: '{part}' is not a section.")
        node[path[-1]] = value
    parsed = parse_params(raw, origin="params (after --params/--set)")
    if parsed.train.model != AUTO or parsed.train.model_args:
        # a named model or its arguments are checked against models/ before anything runs; that imports torch,
        # which loading params never does, so only when there is something to check
        from tasks.training.model_args import check_model_args

        check_model_args(parsed.train)
    return raw, parsed


def write_params(raw: dict, target: str = PARAMS_FILE) -> bool:
    """Make params.yaml hold exactly `raw` (the whole desired mapping, as `resolve` returns it), keeping
    the comments of untouched keys; returns whether anything changed."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    # Keep `null` spelled out (ruamel would write an empty value).
    yaml.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    path = Path(target)
    document = yaml.load(path.read_text())
    before = json.dumps(document, sort_keys=True, default=str)

    def apply(node, values: dict) -> None:
        """Make `node` equal `values` in place, so comments on untouched keys survive; `values` is the whole
        desired mapping, so a key it lacks was removed (e.g. `--set train.model_args={}`)."""
        for key in [key for key in node if key not in values]:
            del node[key]
        for key, value in values.items():
            if isinstance(value, dict) and value and isinstance(node.get(key), dict):
                apply(node[key], value)
            elif node.get(key) != value:
                node[key] = value

    apply(document, raw)
    changed = json.dumps(document, sort_keys=True, default=str) != before
    if changed:
        buffer = io.StringIO()
        yaml.dump(document, buffer)
        write_bytes_atomic(path, buffer.getvalue().encode())
    return changed


TOUCHED_FILES = (Path(PARAMS_FILE), paths.SOURCE_FINGERPRINT)  # what a run or a plan may rewrite


@contextlib.contextmanager
def applied_overrides(raw: dict, keep: bool = True, files: tuple[Path, ...] = TOUCHED_FILES) -> Iterator[bool]:
    """Write the overrides into params.yaml for the block (yields whether anything changed). Every file in
    `files` is put back as it was if the block fails (an exception, Ctrl-C or SIGTERM) and, with
    keep=False (a look, such as `torchship plan`), always."""
    with sigterm_raises():
        saved = {path: path.read_bytes() if path.exists() else None for path in files}
        finished = False
        try:
            yield write_params(raw)
            finished = True
        finally:
            if not (keep and finished):
                restore_files(saved)


def restore_files(saved: dict[Path, bytes | None]) -> None:
    """Put each file's saved bytes back; a file that did not exist before is removed."""
    for path, content in saved.items():
        if content is None:
            path.unlink(missing_ok=True)
        elif not path.exists() or path.read_bytes() != content:
            write_bytes_atomic(path, content)
