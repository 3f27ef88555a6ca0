"""serving/request_log.py: lines wait in memory until a flush (the flusher's or close()'s), reach the file
in append order, and the active file rotates by size and by age into names that sort by time."""
from __future__ import annotations

import json
import statistics
import threading
import time
from datetime import UTC, datetime

import pytest

from serving.request_log import RequestLog
from tasks.core.servelog import feedback_line, rotated_path, served_files, served_line

NOON = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()
NEVER = 1e9   # seconds or bytes: no rotation


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = NOON):
        self.now = now

    def __call__(self) -> float:
        return self.now


def line(index: int, request_id: str = "r") -> str:
    return served_line(request_id, index, "champion", "3", {"plan": "basic", "tenure_months": index}, "no",
                       {"no": 0.8, "yes": 0.2}, ts=NOON)


def logged(path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines()]


@pytest.fixture
def opened(tmp_path):
    """Open a RequestLog on tmp_path/requests.jsonl with the given settings; every one is closed after."""
    logs = []

    def make(flush_seconds: float = NEVER, rotate_bytes: int = int(NEVER), rotate_seconds: float = NEVER,
             clock=None) -> RequestLog:
        request_log = RequestLog(tmp_path / "requests.jsonl", flush_seconds, rotate_bytes, rotate_seconds,
                                 clock or Clock())
        request_log.open()
        logs.append(request_log)
        return request_log

    yield make
    for request_log in logs:
        request_log.close()


def test_nothing_reaches_the_disk_before_a_flush_and_everything_by_close(opened):
    request_log = opened()
    request_log.append(line(0) + line(1))
    request_log.append(line(2))
    assert request_log.path.read_text() == ""
    request_log.close()
    assert [entry["id"] for entry in logged(request_log.path)] == ["r-0", "r-1", "r-2"]


def test_the_flusher_writes_every_flush_seconds(opened):
    """One write per tick of `flush_seconds`: never sooner, and not a tick late (a flusher running at half or
    twice the period fails; waiting only for the first write would pass any period under the deadline)."""
    period = 0.5
    started = time.monotonic()
    request_log = opened(flush_seconds=period)
    written_at, fourth = [], threading.Event()
    write = request_log._write

    def timed_write(data: bytes) -> None:
        write(data)
        written_at.append(time.monotonic())
        if len(written_at) == 4:
            fourth.set()
        else:
            request_log.append(line(len(written_at)))   # something for the next tick to write

    request_log._write = timed_write
    request_log.append(line(0))
    assert fourth.wait(10), written_at
    ticks = [later - earlier for earlier, later in zip([started, *written_at], written_at[:4])]
    assert min(ticks) >= period * 0.95, ticks
    assert statistics.median(ticks) <= period + 0.3, ticks   # a loaded CI box may wake the flusher late, rarely
    assert [entry["id"] for entry in logged(request_log.path)][:4] == ["r-0", "r-1", "r-2", "r-3"]


def test_lines_are_json_in_the_servelog_format_and_append_to_an_existing_file(opened):
    request_log = opened()
    request_log.append(line(0))
    request_log.close()
    request_log.open()   # a restart appends: the earlier rows stay
    request_log.append(line(1, request_id="s"))
    request_log.close()
    first, second = logged(request_log.path)
    assert set(first) == {"ts", "id", "request_id", "variant", "version", "prediction", "probabilities", "features"}
    assert (first["id"], first["request_id"], first["version"]) == ("r-0", "r", "3")
    assert first["probabilities"] == {"no": 0.8, "yes": 0.2} and first["features"]["tenure_months"] == 0
    assert (second["id"], second["request_id"]) == ("s-1", "s")


def test_a_request_never_waits_for_a_slow_disk(opened, monkeypatch):
    request_log = opened()
    release, writing = threading.Event(), threading.Event()
    write = request_log._write

    def slow_write(data: bytes) -> None:
        writing.set()
        release.wait(10)
        write(data)

    monkeypatch.setattr(request_log, "_write", slow_write)
    request_log.append(line(0))
    flusher = threading.Thread(target=request_log.flush)
    flusher.start()
    assert writing.wait(10)
    started = time.monotonic()
    request_log.append(line(1))   # while the flush holds the file
    assert time.monotonic() - started < 1.0
    release.set()
    flusher.join(10)
    request_log.close()
    assert [entry["id"] for entry in logged(request_log.path)] == ["r-0", "r-1"]


def test_the_active_file_rotates_when_larger_than_rotate_bytes(opened):
    request_log = opened(rotate_bytes=2 * len(line(0)) - 1)   # two lines are past it, one is not
    for index in range(5):   # a constant clock: every rotation falls in the same second
        request_log.append(line(index))
        request_log.flush()
    request_log.close()
    files = served_files(request_log.path)
    assert [[entry["id"] for entry in logged(path)] for path in files] == [["r-0", "r-1"], ["r-2", "r-3"], ["r-4"]]
    assert files[0] == rotated_path(request_log.path, "20261130T120000Z")
    assert files[1] == rotated_path(request_log.path, "20261130T120000Z01")   # sorts after the first
    assert files[-1] == request_log.path


def test_the_active_file_rotates_when_older_than_rotate_seconds(opened):
    clock = Clock()
    request_log = opened(rotate_seconds=3600, clock=clock)
    request_log.append(line(0))
    request_log.flush()
    clock.now += 3599
    request_log.append(line(1))
    request_log.flush()
    assert served_files(request_log.path) == [request_log.path]
    clock.now += 2   # the file was opened 3601 s ago
    request_log.append(line(2))
    request_log.flush()
    clock.now += 3599   # the fresh file's age counts from its own opening
    request_log.append(line(3))
    request_log.close()
    rotated = rotated_path(request_log.path, "20261130T130001Z")
    assert served_files(request_log.path) == [rotated, request_log.path]
    assert [entry["id"] for entry in logged(rotated)] == ["r-0", "r-1"]
    assert [entry["id"] for entry in logged(request_log.path)] == ["r-2", "r-3"]


def test_an_empty_file_is_not_rotated_however_old(opened):
    clock = Clock()
    request_log = opened(rotate_seconds=1, clock=clock)
    clock.now += 60
    request_log.append(line(0))
    request_log.close()
    assert served_files(request_log.path) == [request_log.path]


def test_any_path_works_for_any_lines_the_feedback_file_too(tmp_path):
    feedback = RequestLog(tmp_path / "feedback.jsonl")
    feedback.open()
    feedback.append(feedback_line("r-0", "yes", ts=NOON))
    feedback.close()
    assert logged(feedback.path) == [{"ts": NOON, "id": "r-0", "label": "yes"}]


def test_no_path_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    request_log = RequestLog(None, flush_seconds=0.01)
    request_log.open()
    request_log.append(line(0))
    request_log.flush()
    request_log.close()
    assert list(tmp_path.iterdir()) == []


def test_lines_appended_before_open_or_after_close_are_dropped(tmp_path):
    request_log = RequestLog(tmp_path / "requests.jsonl")
    request_log.append(line(0))
    request_log.open()
    request_log.close()
    request_log.append(line(1))
    request_log.flush()
    assert request_log.path.read_text() == ""


def test_workers_logging_to_one_path_lose_no_line_and_follow_each_others_rotations(opened):
    """Two logs on one path (as two serve.workers processes have: separate file descriptions, so separate locks):
    every line lands once and whole, in the file that was active when it was written."""
    size = len(line(0))
    workers = [opened(rotate_bytes=3 * size - 1), opened(rotate_bytes=3 * size - 1)]
    for index in range(12):
        workers[index % 2].append(line(index, request_id=f"w{index % 2}"))
        workers[index % 2].flush()
    for request_log in workers:
        request_log.close()
    files = served_files(workers[0].path)
    ids = [[entry["id"] for entry in logged(path)] for path in files]
    assert sorted(i for names in ids for i in names) == sorted(f"w{i % 2}-{i}" for i in range(12))
    assert all(len(names) <= 3 for names in ids) and len(files) == 4   # rotated after every 3 lines, by either
    assert [i for names in ids for i in names] == [f"w{i % 2}-{i}" for i in range(12)]   # in write order
