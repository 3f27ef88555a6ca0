"""The torchrun job's failure report and injected faults (tasks/training/failure.py), on torchrun's own text; an inline
job's compile switch (tasks/training/run.py)."""
from __future__ import annotations

import os

import pytest
import torch

from tasks.core.env import COMPILE_DISABLE_ENV, FAULT_ENV, RESTART_COUNT_ENV
from tasks.training.failure import describe_failure, injected_fault

# What node 0's torchrun printed (torch 2.13, gloo) when node 1 was killed mid-run
# (tests/integration/test_two_nodes.py).
ROOT_CAUSE = """Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_16:07:33
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4258)
  error_file: <N/A>"""
RESET = ("[default0]:[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
         "Read error [10.213.7.2]:28843: Connection reset by peer. This is typically caused by a remote worker hanging")
CLOSED = ("[default0]:[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
          "Connection closed by peer [10.213.7.2]:50894. This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize("error", [RESET, CLOSED])
def test_a_lost_peer_is_named_by_its_address(tmp_path, error):
    message = describe_failure([error, *ROOT_CAUSE.splitlines()], 1, tmp_path / "logs")
    assert message.startswith("rank 0 of the torchrun job failed first: it lost its connection to the node at "
                              "10.213.7.2, whose rank stopped"), message


def test_without_a_lost_peer_the_exit_code_is_reported(tmp_path):
    message = describe_failure(ROOT_CAUSE.splitlines(), 1, tmp_path / "logs")
    assert message.startswith("rank 0 of the torchrun job failed first: exit code 1 (torchrun exit 1)"), message


def test_an_injected_fault_fires_on_the_first_attempt_only(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "oom:1:3")
    monkeypatch.delenv(RESTART_COUNT_ENV, raising=False)
    fault = injected_fault(1)
    fault(2)   # another step: nothing
    with pytest.raises(torch.OutOfMemoryError):
        fault(3)
    monkeypatch.setenv(RESTART_COUNT_ENV, "0")
    assert injected_fault(1) is not None
    monkeypatch.setenv(RESTART_COUNT_ENV, "1")   # torchrun restarted the worker: it runs clean
    assert injected_fault(1) is None


def test_the_last_lines_come_from_the_failed_rank_s_folder_on_its_node(tmp_path):
    # On node 1 of a two-node job, global rank 1 is local rank 0: torchrun names the log folder by the local rank.
    folder = tmp_path / "logs" / "torchship_x" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text("epoch 1 done\nstep 30\n")
    lines = [CLOSED, *ROOT_CAUSE.replace("rank      : 0 (local_rank: 0)", "rank      : 1 (local_rank: 0)").splitlines()]
    message = describe_failure(lines, 1, tmp_path / "logs")
    assert message.startswith("rank 1 of the torchrun job failed first") and "Its last log lines: epoch 1 done | " \
        "step 30." in message, message


def test_an_inline_job_compiles_nothing_and_leaves_the_switches_as_they_were(monkeypatch):
    import torch._dynamo.config as dynamo

    from tasks.training.run import compile_disabled

    monkeypatch.setenv(COMPILE_DISABLE_ENV, "0")
    with compile_disabled(True):
        assert os.environ[COMPILE_DISABLE_ENV] == "1" and dynamo.disable
    assert os.environ[COMPILE_DISABLE_ENV] == "0" and not dynamo.disable
