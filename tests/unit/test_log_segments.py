"""Shipped log segments (tasks/core/servelog.py, tasks/monitoring/segments.py, tasks/monitoring/window.py,
serving/request_log.py's seal): names that bound the rows they hold, a window merged by time across hosts whose
segments overlap (reading only what can enter it), sealing open and closed logs, and serve.ship_to's rule."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from serving.request_log import RequestLog
from tasks.core.bucket import Location
from tasks.core.params_spec import MonitorParams, ServeParams
from tasks.core.servelog import (
    feedback_line,
    newest_possible_ts,
    rotated_path,
    segment_key,
    served_files,
    served_line,
    shipped_path,
    stamp_of,
    unshipped_segments,
)
from tasks.monitoring.segments import LogSource, local_source
from tasks.monitoring.window import CLOCK_SKEW_S, read_lines, read_window

NOON = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()


@dataclass
class Text:
    """A segment held in memory (the protocol a file and a bucket object share), counting its reads."""

    newest: float
    text: str
    reads: list = field(default_factory=list)

    def read_text(self) -> str:
        self.reads.append(1)
        return self.text


def segment(host: str, times: list[float], newest: float | None = None) -> Text:
    lines = "".join(served_line(host, i, "champion", "1", {"x": t}, "no", {"no": 1.0}, ts=t)
                    for i, t in enumerate(times))
    return Text(max(times) + 1 if newest is None else newest, lines)


def test_a_segment_name_bounds_its_rows_and_keys_name_kind_host_time_and_digest(tmp_path):
    log = tmp_path / "requests.jsonl"
    rotated = rotated_path(log, "20261130T120000Z01")
    assert newest_possible_ts(rotated.name) == NOON + 1 == newest_possible_ts(shipped_path(rotated).name)
    assert newest_possible_ts(log.name) == float("inf")
    assert stamp_of(rotated) == "20261130T120000Z01"
    assert segment_key("logs/a", "requests", "host-1", "20261130T120000Z", "ab12") == \
        "logs/a/requests/host-1/20261130T120000Z-ab12.jsonl"
    assert newest_possible_ts("20261130T120000Z-ab12.jsonl") == NOON + 1
    for path in (log, rotated, rotated_path(log, "20261130T110000Z"), tmp_path / "requests-notes.jsonl"):
        path.write_text("")
    rotated_path(log, "20261130T110000Z").rename(shipped_path(rotated_path(log, "20261130T110000Z")))
    assert unshipped_segments(log) == [rotated]   # not the active file, a shipped one, or a name without a time
    assert shipped_path(rotated_path(log, "20261130T110000Z")) in served_files(log)   # local readers still see it


def test_a_window_takes_the_newest_rows_of_every_host_merged_by_time_and_reads_no_segment_too_old():
    old = segment("a", [100.0, 101.0])                      # older than every row the window keeps: never read
    host_a = segment("a", [200.0, 202.0, 204.0])
    host_b = segment("b", [201.0, 203.0, 205.0])            # overlaps host a's segment
    active = segment("b", [206.0], newest=float("inf"))
    records = read_lines([old, host_a, host_b, active], limit=5, since=0.0)
    assert [r["ts"] for r in records] == [202.0, 203.0, 204.0, 205.0, 206.0]
    assert old.reads == [] and host_a.reads and host_b.reads
    since = read_lines([old, host_a, host_b, active], limit=2**62, since=203.0)
    assert [r["ts"] for r in since] == [203.0, 204.0, 205.0, 206.0] and old.reads == []


def test_labels_join_from_every_feedback_segment_not_closed_before_the_window_began():
    served = segment("a", [float(t) for t in range(5000, 5060)])
    ancient = Text(5000 - CLOCK_SKEW_S - 1, feedback_line("a-0", "yes", ts=1.0))   # closed long before: never read
    late = Text(9000, feedback_line("a-59", "yes", ts=8000.0))
    skewed = Text(5000 - CLOCK_SKEW_S + 1, feedback_line("a-1", "no", ts=4500.0))   # another host's slower clock
    source = LogSource("memory", lambda: [served], lambda: [ancient, skewed, late])
    window = read_window(source, MonitorParams(window_rows=60))
    assert window.labelled.set_index("id")["label"].to_dict() == {"a-1": "no", "a-59": "yes"}
    assert ancient.reads == []


def test_rows_of_one_request_share_a_time_and_keep_their_order():
    request = Text(11.0, "".join(served_line("r", i, "champion", "1", {"x": i}, "no", {"no": 1.0}, ts=10.0)
                                 for i in range(4)))
    assert [r["id"] for r in read_lines([request], 3, 0.0)] == ["r-1", "r-2", "r-3"]


def test_a_cut_line_and_an_empty_list_are_no_rows():
    cut = segment("a", [1.0, 2.0])
    cut.text += '{"ts": 3, "id": "a-'
    assert [r["ts"] for r in read_lines([cut], 10, 0.0)] == [1.0, 2.0]
    assert read_lines([], 10, 0.0) == []


def line(index: int) -> str:
    return served_line("r", index, "champion", "1", {"x": index}, "no", {"no": 1.0}, ts=NOON)


def test_seal_closes_the_active_file_into_a_segment_open_or_closed_and_never_reuses_a_shipped_name(tmp_path):
    log = RequestLog(tmp_path / "requests.jsonl", flush_seconds=1e9, clock=lambda: NOON)
    log.open()
    log.seal()   # nothing written: nothing to close
    assert served_files(log.path) == [log.path]
    log.append(line(0))
    log.flush()
    log.seal()
    first = rotated_path(log.path, "20261130T120000Z")
    assert served_files(log.path) == [first, log.path] and log.path.stat().st_size == 0
    first.rename(shipped_path(first))   # shipped: its name is still taken
    log.append(line(1))
    log.close()
    log.seal()   # after close(), as a clean stop does
    second = rotated_path(log.path, "20261130T120000Z01")
    assert served_files(log.path) == [shipped_path(first), second]
    assert [json.loads(text)["id"] for text in second.read_text().splitlines()] == ["r-1"]


def test_a_local_source_reads_a_segment_shipped_between_listing_and_reading(tmp_path):
    log = tmp_path / "requests.jsonl"
    rotated = rotated_path(log, "20261130T120000Z")
    rotated.write_text(line(0))
    listed = local_source(log).served()
    rotated.rename(shipped_path(rotated))
    assert [r["id"] for r in read_lines(listed, 10, 0.0)] == ["r-0"]


@pytest.mark.parametrize("url", ["s3://key:secret@bucket/x", "s3://Bucket", "https://bucket/x", "s3://b/x?sig=1",
                                 "bucket/prefix"])
def test_ship_to_is_a_bucket_url_without_credentials(url):
    with pytest.raises(ValidationError, match="ship_to"):
        ServeParams(ship_to=url)


def test_a_location_splits_bucket_and_prefix():
    assert ServeParams(ship_to="s3://torchship/serve-logs/").ship_to == "s3://torchship/serve-logs/"
    assert Location.parse("s3://torchship/serve-logs/") == Location("torchship", "serve-logs")
    assert Location.parse("s3://torchship") == Location("torchship", "")
