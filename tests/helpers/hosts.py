"""Hosts on one machine for the journey test: each a Unix user of its own with a private HOME (mode 0700), whose
processes run in a mount namespace of their own. They share nothing but what the servers, the bucket and the git
remote hold. Needs root (useradd, unshare, setpriv); users are named uniquely and removed on every way out.

The interpreter lives under /root (pyenv), which other users may not enter: inside each host's namespace /root is
an empty tmpfs with only the interpreter's folder bound back, read-only, so nothing of root's home is visible and
nothing on the real machine changes (the namespace ends with the host's last process)."""
from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.stack import running

PYTHON_HOME = Path(os.path.realpath(sys.executable)).parents[3]   # e.g. /root/.pyenv (versions/3.11.7/bin/python)
VENV_BIN = Path(sys.executable).parent
# In the namespace: hide /root behind a tmpfs and bind only the interpreter's tree back. $1 is an empty folder to
# stage the bind in (mount points are not namespaced, so it is one of the test's), $2 the user.
ENTER = ('set -e; if [ -d "$3" ]; then mount --bind "$3" "$1"; mount -t tmpfs -o mode=755,size=1m tmpfs /root; '
         'mkdir -p "$3"; mount --bind -o ro "$1" "$3"; umount "$1"; fi; user="$2"; shift 3; '
         'exec setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"')


def require_root() -> None:
    """The hosts are Unix users: a skip that says so, or a failure under CI=true."""
    if os.geteuid() != 0:
        message = "the journey test's hosts are Unix users of their own: run it as root (useradd, unshare, setpriv)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class Host:
    """One "machine": a user, its private HOME, and the environment its processes get."""

    name: str
    user: str
    home: Path
    stage: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A login's environment: the project's interpreter on PATH, this host's HOME and temporary folder, and
        `extra` (the servers' addresses and credentials), never the test's own settings."""
        return {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "USER": self.user,
                "LANG": "C.UTF-8", "TMPDIR": str(self.home / "tmp"), "PREFECT_HOME": str(self.home / ".prefect"),
                "GIT_AUTHOR_NAME": self.name, "GIT_AUTHOR_EMAIL": f"{self.name}@torchship.test",
                "GIT_COMMITTER_NAME": self.name, "GIT_COMMITTER_EMAIL": f"{self.name}@torchship.test",
                # the code under test, where the runner says it is (the venv's `torchship` imports its editable install)
                **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
                # the "machines" share two cores with the rest of the suite: one OpenMP thread a process, as
                # tests/conftest.py sets for every test (a pool of two spin-waits for a core it does not get)
                **({"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if os.environ.get("OMP_NUM_THREADS") else {}),
                **(extra or {})}

    def argv(self, *command: str) -> list[str]:
        """`command` as this host runs it: its own mount namespace, its own user."""
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", ENTER, "sh", str(self.stage),
                self.user, str(PYTHON_HOME), *command]

    def run(self, *command: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*command), cwd=cwd or self.home, env=self.env(env), capture_output=True,
                              text=True, timeout=timeout)

    def start(self, *command: str, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
              ) -> subprocess.Popen:
        """A long-running process of this host (a worker, a service), in a session of its own, its output in `log`."""
        with log.open("ab") as out:
            return subprocess.Popen(self.argv(*command), cwd=cwd or self.home, env=self.env(env), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)


def kill_processes_of(user: str, wait_s: float = 10.0) -> None:
    """SIGKILL, by PID, every process the host's user still runs (a flow run its worker left, a namespace's), and
    wait (bounded) until none is left but zombies: a SIGKILL lands asynchronously, and `userdel` refuses a user
    whose process is still dying (one fresh-clone run left a user behind that way)."""
    import pwd
    import signal
    import time

    uid = pwd.getpwnam(user).pw_uid
    for pid in processes_of(uid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)


def processes_of(uid: int) -> list[int]:
    """The PIDs of `uid`'s processes that are not zombies (a zombie waits only for its parent to read its end)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if proc.stat().st_uid == uid and running(int(proc.name)):
                found.append(int(proc.name))
    return found


@contextlib.contextmanager
def hosts(folder: Path, *names: str) -> Iterator[dict[str, Host]]:
    """One user per name (`tsj-<name>-<random>`), HOME under `folder` (which others may traverse, not list)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o711)
    made: dict[str, Host] = {}
    try:
        for name in names:
            user = f"tsj-{name}-{secrets.token_hex(3)}"
            home, stage = folder / name, folder / f".stage-{name}"
            stage.mkdir(mode=0o700)
            subprocess.run(["useradd", "--home-dir", str(home), "--no-create-home", "--shell", "/usr/sbin/nologin",
                            "--user-group", user], check=True, capture_output=True, timeout=60)
            made[name] = Host(name, user, home, stage)
            (home / "tmp").mkdir(parents=True)
            subprocess.run(["chown", "-R", f"{user}:{user}", str(home)], check=True, timeout=60)
            home.chmod(0o700)
        yield made
    finally:
        for host in made.values():
            kill_processes_of(host.user)
            subprocess.run(["userdel", host.user], capture_output=True, timeout=60)
