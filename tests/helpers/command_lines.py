"""Every process's command line while a test runs: what `ps` shows other users of the machine, where a secret passed
as an argument would be (tests/integration/test_journey.py searches them).

Each program is read as it starts: the kernel's process connector (netlink) reports every exec, and the new
program's /proc/PID/cmdline is read at once, so even a process that lives a few milliseconds is seen. A scan of all
of /proc every SCAN_S adds what events cannot show (a process that rewrites its title, as PostgreSQL's backends do,
and the processes that ran before the watch). Where the kernel refuses the events (no CAP_NET_ADMIN), /proc is
scanned every FALLBACK_SCAN_S instead: a process that lives shorter may be missed there."""
from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from pathlib import Path

from tests.helpers.stack import read

SCAN_S, FALLBACK_SCAN_S = 1.0, 0.1
NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
PROC_CN_MCAST_LISTEN, NLMSG_DONE, PROC_EVENT_EXEC = 1, 3, 2
NLMSG_HEADER, CN_MSG_HEADER = struct.Struct("=IHHII"), struct.Struct("=IIIIHH")
EVENT = struct.Struct("=IIQii")   # proc_event: what, cpu, timestamp, then an exec's pid and tgid


def exec_events() -> socket.socket | None:
    """A netlink socket subscribed to the kernel's process events, or None where that is refused."""
    try:
        events = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    except OSError:
        return None
    try:
        events.bind((0, CN_IDX_PROC))
        events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        listen = struct.pack("=I", PROC_CN_MCAST_LISTEN)
        message = CN_MSG_HEADER.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(listen), 0) + listen
        events.send(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(message), NLMSG_DONE, 0, 0, 0) + message)
    except OSError:
        events.close()
        return None
    events.setblocking(False)
    return events


def exec_pids(datagram: bytes) -> list[int]:
    """The processes that started a new program, from one datagram of process events."""
    pids, offset = [], 0
    while offset + NLMSG_HEADER.size + CN_MSG_HEADER.size + EVENT.size <= len(datagram):
        length = NLMSG_HEADER.unpack_from(datagram, offset)[0]
        what, _, _, _, tgid = EVENT.unpack_from(datagram, offset + NLMSG_HEADER.size + CN_MSG_HEADER.size)
        if what == PROC_EVENT_EXEC:
            pids.append(tgid)
        offset += max(length, 1)
    return pids


class CommandLines:
    """The watch, in a thread while in use. Raw bytes, decoded once at the end."""

    def __init__(self):
        self.raw: set[bytes] = set()
        self.stopped = threading.Event()
        self.events = exec_events()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    @property
    def seen(self) -> set[str]:
        return {line.replace(b"\0", b" ").decode(errors="replace") for line in self.raw}

    def scan(self) -> None:
        self.raw.update(read(Path("/proc", pid, "cmdline")) for pid in os.listdir("/proc") if pid.isdigit())

    def watch(self) -> None:
        self.scan()
        if self.events is None:
            while not self.stopped.wait(FALLBACK_SCAN_S):
                self.scan()
            return
        scanned = time.monotonic()
        while not self.stopped.is_set():
            if select.select([self.events], [], [], SCAN_S)[0]:
                self.drain()
            if time.monotonic() - scanned >= SCAN_S:
                self.scan()
                scanned = time.monotonic()

    def drain(self) -> None:
        """Every event waiting: each new program's command line, read at once."""
        while True:
            try:
                datagram = self.events.recv(65536)
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno != errno.ENOBUFS:
                    raise
                self.scan()   # the kernel dropped events it had no room for: what still runs is read here
                continue
            self.raw.update(read(Path(f"/proc/{pid}/cmdline")) for pid in exec_pids(datagram))

    def __enter__(self) -> CommandLines:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)
        self.scan()
        if self.events is not None:
            self.events.close()
