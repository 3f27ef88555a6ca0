"""Why a torchrun job failed, from torchrun's own summary and the failed rank's log: which rank failed first,
how (a signal, an exit code, a collective timeout and the rank it waited on, a lost peer), its own error and the
last lines it logged; and the real faults the reliability tests inject into a rank (`injected_fault`)."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import torch

from tasks.core import paths
from tasks.core.env import FAULT_ENV, RESTART_COUNT_ENV

# torchrun's per-worker console prefix ("[default0]:[rank0]: ") hides where a line really starts.
WORKER_PREFIX = re.compile(r"^(\[(default|rank)\d+\]:\s?)+")
# How a collective timeout reads: gloo says "Timed out waiting 10000ms for recv operation" or, on a pair
# another operation already timed out, "Application timeout caused pair closure"; nccl's watchdog says
# "Watchdog caught collective operation timeout".
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+\s*ms|Application timeout caused pair closure"
                                r"|collective operation timeout")
# How a lost peer reads in gloo: "Connection closed by peer [10.0.0.2]:41234" or "Read error [10.0.0.2]:41234:
# Connection reset by peer": the address is that of the node whose rank went away.
LOST_PEER = re.compile(r"(?:Connection closed by peer|(?:Read|Write) error) \[([^\]]+)\]:\d+")


def describe_failure(lines: list[str], code: int, logs_folder: Path = paths.TRAIN_LOGS,
                     collective_timeout_s: int | None = None) -> str:
    """From torchrun's summary: which rank failed first, how (a signal, an exit code, or a collective timeout
    and the rank it waited on), its own error and the last lines it logged."""
    text = "\n".join(WORKER_PREFIX.sub("", line) for line in lines)
    root = text[text.find("Root Cause"):] if "Root Cause" in text else text
    # "rank      : 1 (local_rank: 0)": this node's log folders are named by the local rank
    found = re.search(r"rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?", root)
    rank = found[1] if found else "?"
    last = _last_log_lines(logs_folder, (found[2] or found[1]) if found else "0")
    how = _how_it_failed(text, root, rank, last, collective_timeout_s)
    own = [line for line in text.splitlines() if line.startswith("torchship ") and " failed: " in line]
    return (f"rank {rank} of the torchrun job failed first: {how} (torchrun exit {code}). "
            + (f"Its error: {own[0]} " if own else "")
            + (f"Its last log lines: {' | '.join(last)}. " if last else "")
            + f"Re-run to resume from the last checkpoint ({logs_folder.parent / 'checkpoints'}).")


def _how_it_failed(text: str, root: str, rank: str, last: list[str], timeout_s: int | None) -> str:
    """torchrun's signal, else a collective timeout (gloo/nccl say so in the error), else a peer that went away
    (named by its address), else the exit code."""
    signal_name = re.search(r"traceback\s*:\s*Signal \d+ \((\w+)\)", root)
    if signal_name:
        return f"killed by {signal_name[1]}"
    if COLLECTIVE_TIMEOUT.search("\n".join([text, *last])):
        # A rank that times out was waiting on another: torchrun then stops the rest with a signal, and
        # the rank that stopped answering is among those (with two ranks, it is the other one).
        stopped = [r for r, exit_code in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", text)
                   if r != rank and int(exit_code) < 0]
        waited = (f"rank {stopped[0]}, which stopped answering" if len(stopped) == 1 else
                  f"a rank that stopped answering, one of ranks {', '.join(stopped)}" if stopped else
                  "a rank that stopped answering")
        after = f" after {timeout_s} s" if timeout_s else ""
        return f"a collective timed out{after} (train.collective_timeout_s) waiting for {waited}"
    lost = LOST_PEER.search("\n".join([text, *last]))
    if lost:
        return (f"it lost its connection to the node at {lost[1]}, whose rank stopped (killed, crashed, or that "
                "machine or its network went down)")
    exit_code = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    return f"exit code {exit_code[1]}" if exit_code else "unknown cause"


def _last_log_lines(logs_folder: Path, local_rank: str, count: int = 5) -> list[str]:
    """The last non-empty lines of the newest torchrun log file of this node's `local_rank`."""
    logs = sorted(logs_folder.glob(f"**/attempt_*/{local_rank}/*.log"),
                  key=lambda p: p.stat().st_mtime)
    lines = logs[-1].read_text(errors="replace").splitlines() if logs else []
    return [WORKER_PREFIX.sub("", line) for line in lines if line.strip()][-count:]


def injected_fault(rank: int):
    """TORCHSHIP_FAULT=kind:rank:step makes that rank fail for real at that global step, for the
    reliability tests: `kill` (SIGKILL itself), `hang` (stop answering collectives), `oom` (an
    out-of-memory error once, as CUDA would raise). Only on a worker's first attempt: one that torchrun
    restarted (train.max_restarts) runs clean, as after a transient fault."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or os.environ.get(RESTART_COUNT_ENV, "0") != "0":   # a worker torchrun restarted runs clean
        return None
    kind, fault_rank, fault_step = spec.split(":")
    fired = []

    def hook(global_step: int) -> None:
        if rank != int(fault_rank) or global_step != int(fault_step) or fired:
            return
        fired.append(True)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            time.sleep(3600)
        elif kind == "oom":
            raise torch.OutOfMemoryError("injected out-of-memory (TORCHSHIP_FAULT)")

    return hook
