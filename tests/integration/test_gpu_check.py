"""bench/gpu_check.py's CPU mode through its command line, so that its plumbing cannot rot where no GPU is: the
scratch project, the real train and export stages, the plain loop, the JSON and its rendering. Its figures are a
tiny MLP's on the CPU, judged by nothing; a GPU run's are what docs/performance.md renders."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.gpu_check import VARIANTS
from bench.render_table import render_block
from tests.conftest import BIN, REPO

pytestmark = pytest.mark.integration
TRAIN_FIGURES = {"wall_s", "epochs_s", "outside_epochs_s", "outside_breakdown_s", "first_epoch_ratio",
                 "steady_samples_per_s", "val_f1_macro", "batch_size", "device_name", "peak_device_memory_mb",
                 "notes", "strategy", "precision"}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """(the JSON, what the script printed), bench/results/ untouched."""
    results = REPO / "bench" / "results" / "gpu.json"
    before = results.read_bytes() if results.exists() else None
    out = tmp_path_factory.mktemp("gpu-check") / "gpu.json"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--cpu", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (results.read_bytes() if results.exists() else None) == before, "the CPU mode wrote bench/results/"
    return json.loads(out.read_text()), done.stdout


def test_every_variant_ran_or_was_skipped_with_a_reason_it_printed(checked):
    result, printed = checked
    assert result["mode"] == "cpu" and result["goal_met"] is None   # no GPU goal is judged on a CPU
    assert [v["name"] for v in result["variants"]] == [v["name"] for v in VARIANTS]
    assert {v["status"] for v in result["variants"]} <= {"ran", "skipped"}, [
        (v["name"], v.get("reason")) for v in result["variants"] if v["status"] == "failed"]
    for skipped in result["skipped"]:
        assert skipped["reason"] and f"skipped {skipped['name']}: {skipped['reason']}" in printed
    ran = {v["name"]: v for v in result["variants"] if v["status"] == "ran"}
    assert set(ran) == {"ddp-fp32", "export", "fsdp-bf16", "plain-fp32"}


def test_each_run_reports_its_figures_and_the_machine(checked):
    result, _ = checked
    ran = {v["name"]: v for v in result["variants"] if v["status"] == "ran"}
    for name in ("ddp-fp32", "fsdp-bf16"):
        figures = ran[name]["figures"]
        assert set(figures) >= TRAIN_FIGURES, TRAIN_FIGURES - set(figures)
        assert figures["peak_device_memory_mb"] is None and "CPU" in figures["device_name"]
        assert sum(figures["outside_breakdown_s"].values()) == pytest.approx(figures["outside_epochs_s"], abs=0.1)
    assert ran["fsdp-bf16"]["figures"]["strategy"] == "ddp"   # one process: FSDP trains as DDP, and says so
    assert any("shards nothing" in note for note in ran["fsdp-bf16"]["figures"]["notes"])
    assert ran["export"]["settings"]["weights_of"] == "ddp-fp32" and ran["export"]["figures"]["all_publishable"]
    assert ran["plain-fp32"]["figures"]["samples_per_s"] > 0
    assert result["versions"]["torch"] and result["machine"]["cores"]
    assert {t["key"] for t in result["targets"]} >= {"first_epoch_ratio", "outside_epochs_s", "large_samples_per_s"}


def test_the_result_renders_as_cpu_mode(checked):
    result, _ = checked
    text = render_block("gpu", {"gpu": result})
    assert "**CPU mode only**" in text and all(f"| {v['name']} |" in text for v in result["variants"])
