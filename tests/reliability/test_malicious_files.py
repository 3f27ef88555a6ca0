"""Malicious files, refused with a clear message and never executed or expanded:
- a pickle where a model is expected (the trained model, a training checkpoint): refused by torch.load's
  weights-only unpickler; the payload, which would create a file, never runs;
- a compressed bomb as the data source: a gzip CSV that expands 1000x is refused unread (not UTF-8 text), a
  Parquet file whose few KiB declare hundreds of MiB is refused from its metadata, both in bounded memory;
- path traversal: `../../etc/passwd` in a request field is data (logged as sent, opens nothing); an artifact
  location with `../` read from the registry (a model version's source, a run's artifact folder) is refused
  before anything is downloaded, so the service keeps its champion."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.core.errors import DataError, TorchshipError

pytestmark = pytest.mark.reliability


class Payload:
    """Unpickling this runs `touch <marker>`: what a booby-trapped .pt file does to whoever loads it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ---- a pickle where a model is expected ------------------------------------------------------------------------

def test_a_pickle_payload_as_the_trained_model_is_refused_and_never_runs(tmp_path):
    from tasks.training.weights import load_trained

    marker, model = tmp_path / "owned", tmp_path / "model.pt"
    torch.save({"state_dict": Payload(marker), "layout": {}, "model": {}, "classes": []}, model)
    with pytest.raises(TorchshipError) as refused:
        load_trained(model)
    message = str(refused.value)
    assert str(model) in message and "nothing in it ran" in message and "posix.system" in message
    assert "weights_only=False will likely succeed" not in message   # torch's advice would run the payload
    assert not marker.exists(), "the pickle payload ran"


def test_a_pickle_payload_as_a_checkpoint_is_skipped_and_never_runs(tmp_path):
    from tasks.core.artifacts import sha256_file
    from tasks.training.checkpoint import load_latest, save_checkpoint

    folder, marker = tmp_path / "checkpoints", tmp_path / "owned"
    save_checkpoint(folder, 10, {"step": torch.tensor(10)}, "run")
    trap = save_checkpoint(folder, 20, {"step": torch.tensor(20)}, "run")
    torch.save({"step": Payload(marker)}, trap)   # swapped in, and its hash put in the manifest: it looks vouched for
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["checkpoints"][-1]["sha256"] = sha256_file(trap)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    state = load_latest(folder, "run")
    assert int(state["step"]) == 10, "the trapped checkpoint was used, or the previous one not fallen back to"
    assert not marker.exists(), "the pickle payload ran"


# ---- compressed bombs as the data source -----------------------------------------------------------------------

def peak_mib_of(code: str) -> tuple[str, float]:
    """Run `code` in a fresh interpreter; (its last output line but one, its peak resident memory in MiB)."""
    # VmHWM, not ru_maxrss: Linux carries the peak of the process image before exec into ru_maxrss, and a
    # (v)forked child of a big pytest process would report pytest's own peak.
    code += ("import re\nstatus = open('/proc/self/status').read()\n"
             "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) / 1024)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    *_, said, peak = result.stdout.strip().splitlines()
    return said, float(peak)


def load_source_code(path: Path, limit_mb: float) -> str:
    """What the prepare stage does first: read the source (here, through check and load as they run)."""
    return ("from tasks.core.params_spec import DataParams\nfrom tasks.core.errors import DataError\n"
            "from tasks.modalities.table.sources import check_source, load_source\n"
            f"data = DataParams(source={str(path)!r}, target='y', max_source_mb={limit_mb})\n"
            "try:\n    check_source(data, 'y'); load_source(data, with_batches=False); print('read')\n"
            "except DataError as exc:\n    print('refused: ' + str(exc).replace(chr(10), ' '))\n")


def test_a_gzip_csv_that_expands_1000x_is_refused_unread(tmp_path):
    bomb = tmp_path / "customers.csv"   # gzip bytes under a .csv name: 200 MB of rows in ~0.2 MB
    rows = b"0,0\n" * 250_000
    with gzip.open(bomb, "wb", compresslevel=9) as handle:
        handle.write(b"x,y\n")
        for _ in range(200):
            handle.write(rows)
    assert bomb.stat().st_size * 1000 < 200 * len(rows)
    said, peak = peak_mib_of(load_source_code(bomb, limit_mb=2048))
    assert said.startswith("refused: ") and "not UTF-8 text" in said and str(bomb) in said, said
    assert peak < 500, f"the refusal took {peak:.0f} MiB: the bomb was expanded"


def test_a_parquet_file_declaring_more_than_the_limit_is_refused_from_its_metadata(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bomb = tmp_path / "customers.parquet"   # 12 row groups of 4M equal numbers: 366 MiB as float64, ~0.1 MiB on disk
    chunk = pa.table({"y": pa.array(np.zeros(4_000_000, dtype=np.int64))})
    with pq.ParquetWriter(bomb, chunk.schema, compression="zstd") as writer:
        for _ in range(12):
            writer.write_table(chunk)
    assert bomb.stat().st_size < 2**20
    said, peak = peak_mib_of(load_source_code(bomb, limit_mb=256))
    assert said.startswith("refused: ") and "data.max_source_mb (256 MiB)" in said and "48,000,000 rows" in said, said
    assert peak < 500, f"the refusal took {peak:.0f} MiB: the bomb was read"


def test_a_data_file_under_the_limit_is_read(tmp_path):
    from tasks.core.params_spec import DataParams
    from tasks.modalities.table.sources import check_source, load_source

    table = tmp_path / "small.csv"
    table.write_text("x,y\n" + "1,yes\n2,no\n" * 50)
    data = DataParams(source=str(table), target="y", max_source_mb=1)
    check_source(data, "y")
    assert len(load_source(data, with_batches=False)[0]) == 100
    with pytest.raises(DataError, match="over data.max_source_mb"):
        check_source(DataParams(source=str(table), target="y", max_source_mb=1e-4), "y")


# ---- path traversal ------------------------------------------------------------------------------------------

def test_a_path_in_a_request_field_is_just_data(tmp_path):
    from serving.request_log import RequestLog
    from tasks.core.refusals import RowsRefused
    from tasks.core.schema_spec import Feature, Schema
    from tasks.core.servelog import served_bytes
    from tasks.modalities.table.serving import RowDecoder

    schema = Schema(source="t", target="y", classes=["no", "yes"], features=[
        Feature(name="region", kind="categorical", categories=["north"]),
        Feature(name="plan", kind="categorical", categories=["basic"], closed_categories=True)])
    decoder = RowDecoder(schema)
    hostile = "../../../../etc/passwd"
    rows = decoder.decode(json.dumps({"rows": [{"region": hostile, "plan": "basic"}]}).encode())
    assert list(decoder.feed(rows)["region"]) == [hostile]   # the graph sees text (an unknown category)
    with pytest.raises(RowsRefused) as refused:   # a closed category refuses it like any other unknown value
        decoder.decode(json.dumps({"rows": [{"region": "north", "plan": hostile}]}).encode())
    assert refused.value.problems[0]["rule"] == "literal_error"
    log = RequestLog(tmp_path / "requests.jsonl", flush_seconds=60, rotate_bytes=1 << 20, rotate_seconds=3600)
    log.open()
    log.append(served_bytes("r1", 0, "champion", "1", decoder.features(rows, 0), "no", {"no": 1.0, "yes": 0.0}, ts=0))
    log.close()
    assert json.loads((tmp_path / "requests.jsonl").read_text())["features"]["region"] == hostile
    assert not [p for p in tmp_path.rglob("*") if "passwd" in p.name or "etc" in p.parts]


@pytest.fixture(scope="module")
def registry(tiny_pipeline):
    """(client, artifact store, a valid ONNX model's bytes) on the session project's registry, under a model and
    an experiment of their own that are deleted afterwards with the files planted beside the store."""
    from tasks.core.params_spec import TrackingParams
    from tasks.registry.read import registry_client
    from tests.model.test_raw_onnx import SCHEMA, identity_graph

    project, _ = tiny_pipeline
    client = registry_client(TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"))
    client.create_registered_model("m")
    store = project.root / "mlflow" / "artifacts"
    try:
        yield client, store, identity_graph(SCHEMA).SerializeToString()
    finally:
        client.delete_registered_model("m")
        for experiment in client.search_experiments(filter_string="name LIKE 'climbing-%'"):
            client.delete_experiment(experiment.experiment_id)
        for planted in ("outside", "elsewhere"):
            shutil.rmtree(store.parent / planted, ignore_errors=True)
        shutil.rmtree(store / "m1", ignore_errors=True)


def planted_version(client, source: str, payload: bytes) -> str:
    """A version whose source is `source`, tagged with the true sha256 of what lies there: only the path is wrong."""
    version = client.create_model_version("m", source=source).version
    client.set_model_version_tag("m", version, "artifact_sha256", hashlib.sha256(payload).hexdigest())
    return str(version)


def test_a_model_version_whose_source_climbs_out_of_the_store_is_refused(registry):
    from tasks.registry.read import ArtifactRefused, verified_onnx

    client, store, payload = registry
    outside = store.parent / "outside"
    outside.mkdir()
    (outside / "model.onnx").write_bytes(payload)
    for source in (f"{store}/../outside", f"file://{store}/../outside"):
        version = planted_version(client, source, payload)
        with pytest.raises(ArtifactRefused, match=r"climbs out of its folder \('\.\.'\)"):
            verified_onnx(client, "m", version)
    inside = store / "m1"   # the same bytes inside the store are served
    inside.mkdir()
    (inside / "model.onnx").write_bytes(payload)
    assert verified_onnx(client, "m", planted_version(client, str(inside), payload)) == payload


def test_a_run_whose_artifact_folder_climbs_out_is_not_restored_by_a_rebuild(registry, tmp_path):
    from tasks.registry.read import ArtifactRefused
    from tasks.stages.rebuild import _restore_lineage

    client, store, _ = registry
    experiment = client.create_experiment(f"climbing-{uuid.uuid4().hex}", artifact_location=f"{store}/../elsewhere")
    run = client.create_run(experiment).info
    planted = Path(run.artifact_uri) / "lineage"   # what the run would restore, planted outside the store
    planted.mkdir(parents=True)
    for name in ("params.yaml", "dvc.lock"):
        (planted / name).write_text("planted: true\n")
    run = run.run_id
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with pytest.raises(ArtifactRefused, match="climbs out of its folder"):
        _restore_lineage(client, run, workspace)
    assert list(workspace.iterdir()) == []
