"""CPU-seconds per test module, counted by the kernel.

Before each test, the process running it (an xdist worker, or pytest alone) moves itself into a cpuacct cgroup named
for the test's module (`<run>/integration/test_journey`). Every process that test starts is born in that cgroup and
stays there however it detaches: servers in their own sessions, torchrun's workers, PostgreSQL as its own user. A
session fixture counts where it is first used. The report lists each suite and the modules that took the most CPU.

Why CPU and not durations: `make test` runs three workers on two cores and is CPU-bound, so a module's durations
overlap other modules' and do not add up to wall time; what a module adds to the run's wall time is about its
CPU-seconds divided by the cores. Only where cgroup v1's cpuacct hierarchy is writable (root, as in CI); elsewhere
the report says it could not measure."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

HIERARCHY = Path("/sys/fs/cgroup/cpuacct")
RUN_ENV = "TORCHSHIP_TEST_CGROUP"   # the run's cgroup, made by the controller, inherited by the xdist workers


def start() -> None:
    """In the controller (or pytest alone): make the run's cgroup and name it to the workers it will start. In a
    worker: count its start-up (imports, collection) apart from the tests."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        enter("startup/workers")
        return
    if RUN_ENV in os.environ:
        return
    run = HIERARCHY / f"torchship-tests-{os.getpid()}"
    with contextlib.suppress(OSError):   # not root, or no cgroup v1 cpuacct: not measured
        run.mkdir()
        os.environ[RUN_ENV] = str(run)


def enter(module: str) -> None:
    """Move this process (all its threads) into the module's cgroup; the tests it runs next are counted there."""
    run = os.environ.get(RUN_ENV)
    if not run:
        return
    group = Path(run, module)
    with contextlib.suppress(OSError):
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))


def seconds(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9   # this group and every group below it


def report(write_line, top: int = 30) -> None:
    """Per suite and the `top` modules, in CPU-seconds, with each one's share of the run's."""
    run = os.environ.get(RUN_ENV)
    if not run or not Path(run).is_dir() or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = Path(run)
    total = seconds(root)
    suites = sorted((p for p in root.iterdir() if p.is_dir()), key=seconds, reverse=True)
    modules = sorted((m for s in suites for m in s.iterdir() if m.is_dir()), key=seconds, reverse=True)
    write_line(f"{'the whole run':<44} {total:8.1f} CPU-s")
    for group in suites + modules[:top]:
        used = seconds(group)
        write_line(f"{group.relative_to(root).as_posix():<44} {used:8.1f} CPU-s  {100 * used / max(total, 1e-9):5.1f}%")


def finish() -> None:
    """Remove the run's cgroups, moving any process a test left behind to the hierarchy's root first."""
    run = os.environ.get(RUN_ENV)
    if not run or os.environ.get("PYTEST_XDIST_WORKER") or not Path(run).is_dir():
        return
    for group in sorted((p for p in Path(run).rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [Path(run)]:
        with contextlib.suppress(OSError):
            for pid in filter(None, (group / "cgroup.procs").read_text().split()):
                with contextlib.suppress(OSError):
                    (HIERARCHY / "cgroup.procs").write_text(pid)
            group.rmdir()
