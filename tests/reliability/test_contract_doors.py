"""One committed contract, enforced at the training door and the HTTP door: each bad-data case is refused
naming the column and rule, exits non-zero, and leaves the registry and the last good artifacts as they were."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from tests.conftest import make_project

pytestmark = pytest.mark.integration
MODEL = "customers"


def _reference(rows: int = 3000, seed: int = 21):
    from tasks.core.sources import generate_customers

    table = generate_customers(rows, seed=seed)
    table.insert(0, "customer_id", np.arange(1, rows + 1))
    return table


@pytest.fixture(scope="module")
def contracted(tmp_path_factory):
    """A project whose contract was suggested from reference data, reviewed (key added) and committed."""
    project = make_project(tmp_path_factory.mktemp("contract"))
    _reference().to_csv(project.root / "data" / "customers.csv", index=False)
    suggested = project.torchship("contract", "suggest", "data/customers.csv", "--target", "churned")
    assert suggested.returncode == 0, suggested.stderr
    reviewed = suggested.stdout.replace("  target: churned\n", "  target: churned\n  key: customer_id\n", 1)
    (project.root / "contract.yaml").write_text(reviewed)
    first = project.torchship("run", "--params", "contract.yaml", "--set", "data.source=data/customers.csv",
                              "--set", "data.target=churned")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "champion" in project.registry(MODEL)["aliases"]
    # The key column is data, not a feature: the canary must not send it (the service would refuse it).
    assert "│ canary   │ pass" in first.stdout, first.stdout[-3000:]
    return project


def _snapshot(project):
    files = ["params.yaml", "data/prepare/train.parquet", "data/train/model.pt", "data/export/model.onnx"]
    return {f: hashlib.sha256((project.root / f).read_bytes()).hexdigest() for f in files}, project.registry(MODEL)


def _bad(table, case):
    table = table.copy()
    if case == "missing column":
        return table.drop(columns=["plan"])
    if case == "out of range":
        table.loc[table.index[:5], "customer age"] = 500
    elif case == "unseen category":
        table.loc[table.index[:3], "region"] = "mars"
    elif case == "too many nulls":
        table.loc[table.index[: int(len(table) * 0.6)], "satisfaction"] = np.nan
    elif case == "duplicated key":
        table.loc[table.index[:4], "customer_id"] = 7
    elif case == "too few rows":
        table = table.head(60)
    elif case == "single-class target":
        table["churned"] = "no"
    elif case == "class share":
        keep = table[table["churned"] == "no"].index.union(table[table["churned"] == "yes"].index[:20])
        table = table.loc[keep]
    return table


CASES = {  # case -> words the error must contain (column, rule, count)
    "missing column": ["'plan'", "missing", "required by the contract"],
    "wrong dtype": ["'tenure_months'", "numeric", "line 12"],
    "out of range": ["'customer age'", "between", "5 offending rows"],
    "unseen category": ["'region'", "in_set", "3 offending rows", "mars"],
    "too many nulls": ["'satisfaction'", "not_be_null"],
    "duplicated key": ["'customer_id'", "unique", "5 offending rows"],  # 4 set to 7, plus id 7 itself,
    "too few rows": ["row_count"],
    "single-class target": ["'churned'", "single class"],
    "class share": ["class 'yes'", "min_class_share"],
    "empty file": ["is empty"],
    "not a CSV": ["not a valid CSV"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_is_refused_at_the_training_door(contracted, case):
    project = contracted
    before = _snapshot(project)
    path = project.root / "data" / "batch.csv"
    if case == "empty file":
        path.write_bytes(b"")
    elif case == "not a CSV":
        path.write_bytes(bytes(range(256)) * 20)
    else:
        _bad(_reference(), case).to_csv(path, index=False)
        if case == "wrong dtype":
            lines = path.read_text().splitlines()
            cells = lines[11].split(",")
            cells[2] = "abc"                     # tenure_months on file line 12
            lines[11] = ",".join(cells)
            path.write_text("\n".join(lines) + "\n")
    result = project.torchship("run", "--set", "data.source=data/batch.csv")
    assert result.returncode != 0
    for words in CASES[case]:
        assert words in result.stderr, f"{words!r} not in: {result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr
    assert _snapshot(project) == before
    path.unlink()


def test_the_same_bad_row_is_refused_at_both_doors(contracted):
    project = contracted
    row = _reference().drop(columns=["customer_id", "churned"]).head(1)
    row.loc[row.index[0], "customer age"] = 500
    # Training door.
    batch = _reference()
    batch.loc[batch.index[0], "customer age"] = 500
    batch.to_csv(project.root / "data" / "batch.csv", index=False)
    trained = project.torchship("run", "--set", "data.source=data/batch.csv")
    assert trained.returncode != 0 and "'customer age'" in trained.stderr and "between" in trained.stderr
    # HTTP door: the service's request model comes from the same contract (carried in the model file).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = subprocess.Popen([sys.executable, "-m", "serving", "--port", str(port)], cwd=project.root,
                               env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json().get("champion"):
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        payload = {k: (None if v != v else v) for k, v in row.iloc[0].to_dict().items()}
        response = httpx.post(f"http://127.0.0.1:{port}/predict", json={"rows": [payload]})
        assert response.status_code == 422, response.text
        problem = response.json()["detail"][0]
        assert problem["field"] == "customer age" and problem["rule"] == "less_than_equal"
        payload["customer age"] = 40.0
        assert httpx.post(f"http://127.0.0.1:{port}/predict", json={"rows": [payload]}).status_code == 200
    finally:
        service.terminate()
        service.wait(timeout=15)
        (project.root / "data" / "batch.csv").unlink(missing_ok=True)


def test_a_new_batch_is_judged_before_it_joins_the_training_set(contracted):
    project = contracted
    batches = project.root / "data" / "batches"
    good = _reference(400, seed=99)
    good["customer_id"] += 10_000
    good.to_csv(project.root / "data" / "good.csv", index=False)
    bad = good.copy()
    bad.loc[bad.index[:3], "region"] = "atlantis"
    bad.to_csv(project.root / "data" / "bad.csv", index=False)

    refused = project.torchship("ingest", "data/bad.csv")
    assert refused.returncode != 0
    assert "'region'" in refused.stderr and "in_set" in refused.stderr and "3 offending rows" in refused.stderr
    assert not (project.root / "data" / "bad.csv").exists(), "a refused batch must be moved to quarantine"
    quarantined = list((project.root / "data" / "quarantine").glob("*-bad/report.json"))
    assert quarantined and list(quarantined[0].parent.glob("bad.csv"))
    assert not list(batches.glob("*.parquet")), "the training set must stay as it was"

    accepted = project.torchship("ingest", "data/good.csv")
    assert accepted.returncode == 0, accepted.stderr
    assert len(list(batches.glob("*.parquet"))) == 1
    plan = project.torchship("plan")
    rows = {line.split("│")[1].strip(): line.split("│")[2] for line in plan.stdout.splitlines() if line.count("│") >= 3}
    assert "run" in rows["prepare"], plan.stdout  # prepare re-runs on the grown training set
    for path in batches.glob("*.parquet"):
        path.unlink()
