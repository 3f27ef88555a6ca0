"""The checks before any stage runs, in a child process: the pinned pretrained weights' sha256 (tasks/training/
pretrained.py), then your own module's probe (tasks/training/probe.py) under a wall-clock limit and a memory limit, so
a module whose `forward` hangs or allocates without end is stopped and named in seconds, and `torchship run` itself
never executes your code (nor does `torchship plan`, which runs no probe).

The child (`python -m tasks.training.probe_process`, in the project folder: the module is found as the stages find it)
reads the params on stdin, checks the pin, sets RLIMIT_AS to what its own imports use plus PROBE_MEMORY_BYTES, says
`ready`, and runs the probe: from then on it has PROBE_SECONDS. Past it the child's stack is dumped (faulthandler),
the frame in your code named, and the child killed. Its answer is one JSON line: nothing else crosses (no pickle)."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from tasks.core.errors import ConfigError

PROBE_SECONDS = 60.0              # your module's share: import, build, forward, backward, state dict, torch.export
PROBE_MEMORY_BYTES = 4 << 30      # address space the probe may add to what the child's own imports took
STARTUP_SECONDS = 300.0           # the child's own imports and the weights' hash (a large file takes a while)
READY, ANSWER = "torchship-probe-ready", "torchship-probe-answer "
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
ROOT = Path(__file__).resolve().parents[2]   # the folder holding this torchship's packages
OWN = tuple(str(ROOT / package) + os.sep for package in ("tasks", "models", "flows", "serving"))


class ProbeFailed(ConfigError):
    """The checks before the stages refused the model or the weights, or the probe had to be stopped."""


def check_before_stages(raw: dict, model: str, pretrained: str | None, seconds: float = PROBE_SECONDS,
                        memory_bytes: int = PROBE_MEMORY_BYTES) -> None:
    """Run the child on the params `raw` (as resolve returns them) when there is something to check: an own module
    (`package.module:Class` in `model`) or pinned `pretrained` weights. Raises ProbeFailed naming the cause."""
    if ":" not in model and not pretrained:
        return
    # the child imports this very torchship (its root first), then your module as the stages do (the project folder,
    # then PYTHONPATH)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    child = subprocess.Popen([sys.executable, "-m", "tasks.training.probe_process"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": path})
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []
    threading.Thread(target=_pump, args=(child.stdout, lines.put), daemon=True).start()
    threading.Thread(target=_pump, args=(child.stderr, errors.append), daemon=True).start()
    try:
        child.stdin.write(json.dumps({"raw": raw, "memory_bytes": memory_bytes}))
        child.stdin.close()
        answer = _wait_for(lines, STARTUP_SECONDS, child, errors, model, "its imports and the weights' check")
        if answer is None:   # ready: the probe's own time starts
            answer = _wait_for(lines, seconds, child, errors, model, "the probe")
    finally:
        _kill(child)
    if answer["ok"]:
        return
    message = answer["message"]
    if re.search(r"MemoryError|can't allocate memory|out of memory", message):
        message += (f" The probe may use {memory_bytes / 2**30:g} GiB of memory beyond its own imports "
                    "(docs/own-model.md): a module that needs more for a batch of six is likely to fail in training.")
    raise ProbeFailed(message)


def _pump(stream, put) -> None:
    for line in stream:
        put(line.rstrip("\n"))
    put(None)


def _wait_for(lines: queue.Queue, seconds: float, child: subprocess.Popen, errors: list[str], model: str,
              what: str) -> dict | None:
    """The child's answer (parsed), or None when it said it is ready, within `seconds`; else ProbeFailed: stopped at
    the limit (naming the frame it was in), or dead (naming how)."""
    started = time.monotonic()
    deadline = started + seconds
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            elapsed, where = time.monotonic() - started, _stuck_in(child, errors)
            raise ProbeFailed(f"train.model {model} breaks the model contract, rule: the probe ends within "
                              f"{seconds:g} s (docs/own-model.md). It was stopped after {elapsed:.0f} s in {what}, "
                              f"{where}; nothing was trained.") from None
        if line is None:   # the child ended without its answer
            child.wait()
            raise ProbeFailed(f"train.model {model}: the checks before the stages ended without an answer "
                              f"({_death(child.returncode)}) during {what}. Their last words: "
                              f"{' | '.join(errors[-3:]) or 'none'}; nothing was trained.")
        if line == READY:
            return None
        if line.startswith(ANSWER):
            return json.loads(line.removeprefix(ANSWER))


def _stuck_in(child: subprocess.Popen, errors: list[str]) -> str:
    """Where the child was when it was stopped: its stack dumped (SIGUSR1, faulthandler), the innermost frame in a
    file that is neither Python's, a library's nor torchship's own (your code), else the innermost of all."""
    try:
        child.send_signal(signal.SIGUSR1)
    except ProcessLookupError:
        return "its process already gone"
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not any(FRAME.search(line) for line in errors):
        time.sleep(0.05)
    time.sleep(0.2)   # the rest of the dump
    frames = [found for line in list(errors) if (found := FRAME.search(line))]
    libraries = tuple(sysconfig.get_paths()[key] + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    yours = [f for f in frames if not f["file"].startswith(libraries + OWN)]
    frame = (yours or frames or [None])[0]
    return f"in {frame['function']} ({frame['file']}, line {frame['line']})" if frame else "where, it did not say"


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return f"killed by {name}" + (": out of memory?" if name == "SIGKILL" else "")
    return f"exit {code}"


def _kill(child: subprocess.Popen) -> None:
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)   # its session: anything the module started goes too
        except ProcessLookupError:
            pass
        child.wait(timeout=10)


def main() -> None:
    """The child: the params from stdin, the pin checked, the limit set, the probe run, one JSON answer line."""
    import faulthandler
    import resource

    from models import failed_at
    from tasks.config import parse_params
    from tasks.core.artifacts import redacted
    from tasks.core.errors import TorchshipError
    from tasks.training.pretrained import check_pretrained
    from tasks.training.probe import probe_own_model

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    request = json.loads(sys.stdin.read())
    try:
        params = parse_params(request["raw"], origin="params (after --params/--set)")
        check_pretrained(params.train.pretrained)
        used = int(re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text())[1]) * 1024
        limit = used + int(request["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        print(READY, flush=True)
        probe_own_model(params)
        answer = {"ok": True}
    except TorchshipError as exc:   # a rule of the contract, the pin, the source: each says what and where
        answer = {"ok": False, "message": str(exc)}
    except Exception as exc:   # the probe could not even be set up (a bug: its place is said)
        answer = {"ok": False, "message": f"train.model {request['raw'].get('train', {}).get('model')}: the checks "
                                          f"before the stages failed: {redacted(exc)} at {failed_at(exc)}."}
    print(ANSWER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
