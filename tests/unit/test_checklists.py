"""The "Add a step" and "Add a model" checklists of docs/development.md, followed in a copy of the repository: a
throwaway step and a throwaway model family, each written in the files the checklist names and no other. Every
list that names steps or models (the flow's order, `torchship plan`, the summary's headline, the code deps, the
typed loader and the configuration docs, the diagram and the step table, the model registry and its arguments)
picks them up."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
COPIED = ("tasks", "models", "flows", "serving", "docs", "README.md", "dvc.yaml", "params.yaml")

STEP = '''"""score: a throwaway step, written by tests/unit/test_checklists.py."""
from __future__ import annotations

from tasks.core.artifacts import write_json_atomic
from tasks.core.params_spec import Params
from tasks.stages.entry import stage_main
from tasks.stages.stage_list import metrics_file


def run(params: Params) -> None:
    write_json_atomic(metrics_file("score"), {"factor": params.score.factor,
                                              "headline": f"scored with factor {params.score.factor}"})


if __name__ == "__main__":
    stage_main("score", run)
'''
SPEC = '''class ScoreParams(Section):
    """The throwaway step."""

    factor: int = Field(2, ge=1, description="What it scores with.")


'''
STAGE = '''  score:
    cmd: python -m tasks.score
    desc: a throwaway step
    meta:
      headline: the factor it scored with
    deps:
      - data/profile/report.json
    params:
      - score
    metrics:
      - data/score/metrics.json:
          cache: false
'''
MODEL = '''"""A throwaway model family, written by tests/unit/test_checklists.py."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from models.tabular import FeatureLayout, TabularPreprocessor


@dataclass(frozen=True)
class WideConfig:
    """`train.model_args` of the `wide` model."""

    width: int = field(default=8, metadata={"doc": "Hidden width."})


class Wide(nn.Module):
    Config = WideConfig
    default_lr = 3e-3

    def __init__(self, layout: FeatureLayout, **hyper):
        super().__init__()
        config = WideConfig(**hyper)
        self.preprocess = TabularPreprocessor(layout, 4)
        self.body = nn.Sequential(nn.Linear(self.preprocess.out_features, config.width), nn.ReLU(),
                                  nn.Linear(config.width, layout.n_classes))

    def forward(self, x):
        return self.body(self.preprocess(x))


MODELS = {"wide": Wide}
'''


def copy_repository(target: Path) -> dict[str, str]:
    """The parts of the repository the checklists touch, copied; returns each file's sha256."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target / name)
    return hashes(target)


def hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def changed(root: Path, before: dict[str, str]) -> set[str]:
    after = hashes(root)
    return {name for name in set(before) | set(after) if before.get(name) != after.get(name)}


def in_copy(root: Path, code: str) -> str:
    """Run `code` in a fresh interpreter on the copy's modules (its tasks/ and models/, not the repository's)."""
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_new_step_takes_five_files_by_hand_and_every_list_of_steps_follows(tmp_path):
    before = copy_repository(tmp_path)
    (tmp_path / "tasks" / "score.py").write_text(STEP)                                     # 1. the step
    spec = tmp_path / "tasks" / "core" / "params_spec.py"                                  # 2. its section's spec
    spec.write_text(spec.read_text().replace("class Params(Section):", SPEC + "class Params(Section):").replace(
        "    tracking: TrackingParams = TrackingParams()\n", "    tracking: TrackingParams = TrackingParams()\n"
        "    score: ScoreParams = ScoreParams()\n"))
    dvc = tmp_path / "dvc.yaml"
    dvc.write_text(dvc.read_text() + STAGE)                                                 # 3. its dvc.yaml block
    params = tmp_path / "params.yaml"
    params.write_text(params.read_text() + "score:\n  factor: 3\n")                        # 4. its params section
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_score.py").write_text("def test_score():\n    pass\n")     # 5. its test
    hand = changed(tmp_path, before)
    assert hand == {"tasks/score.py", "tasks/core/params_spec.py", "dvc.yaml", "params.yaml", "tests/test_score.py"}

    # the one typed loader validates the step's section as it does the others, and imports no step
    printed = in_copy(tmp_path, """
import sys
from tasks.config import load_params, parse_params
from tasks.core.errors import ConfigError
assert parse_params({'train': {'epochs': 3}}).train.epochs == 3
assert load_params().score.factor == 3 and 'tasks.score' not in sys.modules
for raw, said in (({'score': {'factr': 1}}, "unknown key 'score.factr' (known keys here: factor)"),
                  ({'score': {'factor': 0}}, "'score.factor': Input should be greater than or equal to 1"),
                  ({'scroe': {'factor': 3}}, "unknown key 'scroe' (known keys here: data, prepare, ")):
    try:
        parse_params(raw)
    except ConfigError as exc:
        assert said in str(exc) and ('scroe' not in raw or ', score,' in str(exc)), str(exc)
    else:
        raise AssertionError(f'{raw} was accepted')
print('ok')
""")
    assert printed.strip() == "ok"

    printed = in_copy(tmp_path, """
from pathlib import Path
from tasks.stages.code_deps import stale_code_deps, write_code_deps
from tasks.stages.plan import plan_steps
from tasks.stages.stage_list import metrics_file, pipeline_stages, stage_folder
from tasks.workspace.config_docs import write_generated_docs
root = Path('.')
assert write_code_deps(root) == ['score'] and stale_code_deps(root) == {}
write_generated_docs(root)
stages = pipeline_stages(root)
assert stages[-1] == 'score', stages
assert [row.step for row in plan_steps(stages, {'score': ['new']})][-4:] == ['score', 'bless', 'register', 'canary']
assert metrics_file('score', root) == Path('data/score/metrics.json') and stage_folder('score') == Path('data/score')
print('ok')
""")
    assert printed.strip() == "ok"
    generated = changed(tmp_path, before) - hand
    assert generated == {"docs/configuration.md", "README.md", "docs/architecture.md", "docs/getting-started.md"}
    assert "`score.factor`" in (tmp_path / "docs" / "configuration.md").read_text()
    assert "profile ─► score" in (tmp_path / "docs" / "architecture.md").read_text()
    assert "| score | ran / skipped | the factor it scored with |" in (tmp_path / "docs" / "getting-started.md"
                                                                        ).read_text()
    # the step runs as DVC runs it, and the summary's headline comes from its metrics file
    subprocess.run([sys.executable, "-m", "tasks.score"], cwd=tmp_path, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert in_copy(tmp_path, "from tasks.stages.stage_list import headline; print(headline('score'))").strip() == \
        "scored with factor 3"


def test_a_new_model_family_takes_two_files_by_hand_and_no_list_names_it(tmp_path):
    before = copy_repository(tmp_path)
    (tmp_path / "models" / "wide.py").write_text(MODEL)                                     # 1. the model file
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_wide.py").write_text("def test_wide():\n    pass\n")       # 2. its test
    assert changed(tmp_path, before) == {"models/wide.py", "tests/test_wide.py"}

    printed = in_copy(tmp_path, """
from pathlib import Path
import torch
import models
from models.tabular import FeatureLayout
from tasks.core.errors import ConfigError
from tasks.stages.code_deps import code_deps
from tasks.training.model_args import model_kwargs
assert 'wide' in models.MODELS and models.default_lr('wide') == 3e-3
assert model_kwargs('wide', {'width': 4}) == {'width': 4}
try:
    model_kwargs('wide', {'depth': 2})
except ConfigError as exc:
    assert 'not arguments of wide' in str(exc)
else:
    raise AssertionError('an argument the model does not take was accepted')
layout = FeatureLayout([0, 1], [], [], [0.0, 0.0], [1.0, 1.0], 3)
assert models.build_model('wide', layout, width=4)(torch.zeros(5, 2)).shape == (5, 3)
assert 'models/wide.py' in code_deps('train', Path('.')) and 'models/wide.py' not in code_deps('prepare', Path('.'))
print('ok')
""")
    assert printed.strip() == "ok"
