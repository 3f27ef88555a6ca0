"""The "Add a step", "Add a model" and "Add a modality" checklists of docs/development.md, followed in a copy of the
repository: a throwaway step, model family and modality, each written in the files the checklist names and no other.
Every list that names steps or models (the flow's order, `torchship plan`, the summary's headline, the code deps,
the typed loader and the configuration docs, the diagram and the step table, the model registry and its arguments)
picks them up, and the steps and the service take the modality without an edit."""
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


MODALITY = '''"""A throwaway modality, written by tests/unit/test_checklists.py: generated fixed-length vectors."""
from __future__ import annotations

import numpy as np

from tasks.modalities.interface import Holdout, Modality, Split

PREFIX, INPUT, WIDTH = "vectors:", "vector", 4


class Vectors(Modality):
    name = "vectors"
    int8 = ("dynamic",)

    def claims(self, data, params) -> bool:
        return data.source.startswith(PREFIX)

    def default_target(self, data, params) -> str:
        return "label"

    def check_source(self, params, target) -> None:
        pass

    def fingerprint(self, params) -> dict:
        return {"source": params.data.source}

    def prepare(self, params, target) -> dict:
        from tasks.modalities.vectors.parts import prepare

        return prepare(params, target)

    def read_split(self, path, schema) -> Split:
        import pandas as pd

        frame = pd.read_parquet(path)
        return Split(frame[list(map(str, range(WIDTH)))].to_numpy(np.float32), frame["label"].to_numpy(np.int64))

    def load_holdout(self, schema, path) -> Holdout:
        import pandas as pd

        split = self.read_split(path, schema)
        return Holdout(pd.read_parquet(path), split.inputs, {INPUT: split.inputs}, split.labels)

    def probe(self, holdout, schema, count):
        return holdout.inputs[:count], holdout.labels[:count]

    def fit_layout(self, inputs, schema):
        from models.tabular import FeatureLayout

        return FeatureLayout(list(range(WIDTH)), [], [], [0.0] * WIDTH, [1.0] * WIDTH, len(schema.classes))

    def layout_from_dict(self, saved):
        from models.tabular import FeatureLayout

        return FeatureLayout(**saved)

    def export_example(self, schema):
        import torch

        return torch.zeros(4, WIDTH)

    def compose(self, bare, schema):
        from tasks.modalities.vectors.parts import compose

        return compose(bare, schema)

    def feed(self, schema, inputs) -> dict:
        return inputs if isinstance(inputs, dict) else {INPUT: inputs}

    def bare_inputs(self, schema, feed):
        return feed[INPUT]


MODALITY = Vectors()
'''
PARTS = '''"""The throwaway modality's prepare and served graph."""
from __future__ import annotations

import numpy as np
import pandas as pd
from onnx import TensorProto, helper

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.graph_nodes import MODEL, assemble, at_opset
from tasks.core.runtime import DECISION, RAW_INPUTS
from tasks.core.schema_spec import Schema
from tasks.modalities.vectors import INPUT, WIDTH


def prepare(params, target: str) -> dict:
    rng = np.random.default_rng(params.data.seed)
    labels = np.arange(300) % 3
    frame = pd.DataFrame(rng.normal(labels[:, None] * 2.0, 1.0, (300, WIDTH)), columns=list(map(str, range(WIDTH))))
    frame["label"] = labels
    for name, part in (("train", frame[:200]), ("val", frame[200:250]), ("holdout", frame[250:])):
        part.to_parquet(paths.PREPARE / f"{name}.parquet", index=False)
    schema = Schema(source=params.data.source, target=target, classes=["0", "1", "2"], modality="vectors")
    paths.SCHEMA.write_text(schema.to_json())
    metrics = {"rows": {"train": 200, "val": 50, "holdout": 50}, "classes": 3, "headline": "300 vectors"}
    write_json_atomic(paths.PREPARE_METRICS, metrics)
    return metrics


def compose(bare, schema: Schema):
    inner = at_opset(bare)
    front = [helper.make_node("Identity", [INPUT], [f"{MODEL}x"])]
    inputs = [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", WIDTH])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.INT64 if name == DECISION else TensorProto.FLOAT,
                                             ["batch", 3]) for name in ("logits", "probabilities", DECISION)]
    metadata = {p.key: p.value for p in bare.metadata_props}
    from onnx import compose as onnx_compose

    return assemble(onnx_compose.add_prefix(inner, MODEL), front, inputs, outputs, None, 3,
                    {**metadata, **RAW_INPUTS}, "vectors")
'''
SERVING = '''"""The throwaway modality's serving part: {"vectors": [[x0, x1, x2, x3], ...]}."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

from tasks.core.refusals import BodyRefused
from tasks.modalities.vectors import INPUT, WIDTH


@dataclass
class Vectors:
    rows: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def extend(self, other) -> None:
        self.rows += other.rows


class VectorDecoder:
    inline_body_bytes = 1 << 16

    def __init__(self, schema):
        self.schema = schema

    def decode(self, body: bytes, content_type=None) -> Vectors:
        rows = orjson.loads(body).get("vectors")
        if not rows or any(len(row) != WIDTH for row in rows):
            raise BodyRefused(422, f"body must be {{'vectors': [[{WIDTH} numbers], ...]}}")
        return Vectors(rows)

    def feed(self, items: Vectors) -> dict:
        return {INPUT: np.asarray(items.rows, dtype=np.float32)}

    def features(self, items: Vectors, index: int) -> dict:
        return {str(i): value for i, value in enumerate(items.rows[index])}

    def blank(self) -> Vectors:
        return Vectors([[0.0] * WIDTH])

    def inputs(self) -> set:
        return {INPUT}


class VectorServing:
    def decoder(self, schema, host=None) -> VectorDecoder:
        return VectorDecoder(schema)


SERVING = VectorServing()
'''


def test_a_new_modality_takes_its_package_and_two_files_and_no_step_service_or_monitor_changes(tmp_path):
    """A throwaway modality, added as docs/development.md says: its package, a params change pointing at its data,
    and its test. prepare, train and export run it as DVC runs them, and the service answers a request with it; no
    existing step, service or monitor file was edited (nor any other)."""
    before = copy_repository(tmp_path)
    package = tmp_path / "tasks" / "modalities" / "vectors"
    package.mkdir()
    (package / "__init__.py").write_text(MODALITY)                                       # 1. its package
    (package / "parts.py").write_text(PARTS)
    (package / "serving.py").write_text(SERVING)
    params = tmp_path / "params.yaml"                                                     # 2. its params (its data)
    params.write_text(params.read_text().replace("  source: synthetic ", "  source: vectors:blobs ", 1)
                      .replace("  model: auto ", "  model: mlp ", 1).replace("  adapt: true ", "  adapt: false ", 1)
                      .replace("  epochs: 8 ", "  epochs: 2 ", 1).replace("  compile: true ", "  compile: false ", 1))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_vectors.py").write_text("def test_vectors():\n    pass\n")    # 3. its test
    hand = changed(tmp_path, before)
    assert {name for name in hand if not name.startswith("tasks/modalities/vectors/")} == {
        "params.yaml", "tests/test_vectors.py"}

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TORCHSHIP_STAGE_LOG": str(tmp_path / "stage-log")}
    (tmp_path / "data" / "prepare").mkdir(parents=True)
    for stage in ("prepare", "train", "export"):   # as dvc.yaml runs them
        done = subprocess.run([sys.executable, "-m", f"tasks.{stage}"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{stage}: {done.stderr[-3000:]}"
    printed = in_copy(tmp_path, """
from pathlib import Path
import onnx
from fastapi.testclient import TestClient
from serving.app import create_app
from serving.service import ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.schema_spec import load_schema
from tasks.modalities import modality_of
schema = load_schema(Path('data/prepare/schema.json'))
served = modality_of(schema).compose(onnx.load('data/export/model.onnx'), schema)
onnx.save(served, 'served.onnx')
settings = ServiceSettings(serve=ServeParams(request_log=''), model_name='m', tracking=TrackingParams(),
                           model_file=Path('served.onnx'))
with TestClient(create_app(settings)) as client:
    answer = client.post('/predict', json={'vectors': [[0.0, 0.1, 0.0, 0.2], [4.0, 4.1, 3.9, 4.2]]})
    assert answer.status_code == 200, answer.text
    labels = [p['label'] for p in answer.json()['predictions']]
    assert client.post('/predict', json={'vectors': [[1.0]]}).status_code == 422
print(modality_of(schema).name, labels)
""")
    assert printed.strip() == "vectors ['0', '2']"
    produced = changed(tmp_path, before) - hand   # what the stages and the service wrote: nothing of the code
    assert all(name.startswith(("data/", "stage-log/", "mlflow/")) or name == "served.onnx" for name in produced), \
        sorted(produced)
