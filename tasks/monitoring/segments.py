"""Where a window of served traffic is read from: the service's own files on this host (the embedded default), or
the segments every serving host shipped to `serve.ship_to` (serving/shipper.py). Both are lists of segments, oldest
first, that tasks/monitoring/window.py reads the same way."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tasks.core.bucket import Location, get_text, list_keys, s3_client
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import ServeParams
from tasks.core.servelog import (
    FEEDBACK_KIND,
    SERVED_KIND,
    feedback_path,
    newest_possible_ts,
    served_files,
    shipped_path,
)


class Segment(Protocol):
    newest: float   # no row in it is newer (unix seconds); inf for a file still being written

    def read_text(self) -> str: ...


@dataclass(frozen=True)
class LocalSegment:
    path: Path
    newest: float

    def read_text(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:   # shipped (renamed) between listing and reading
            return shipped_path(self.path).read_text(encoding="utf-8")


@dataclass(frozen=True)
class BucketSegment:
    client: object
    location: Location
    key: str
    newest: float

    def read_text(self) -> str:
        return get_text(self.client, self.location, self.key)


@dataclass(frozen=True)
class LogSource:
    """Served rows and feedback, each a list of segments (listed when called: a source outlives a rotation)."""

    where: str                                  # for messages: a path or a bucket URL
    served: Callable[[], list[Segment]]
    feedback: Callable[[], list[Segment]]


def local_segments(log: Path) -> list[Segment]:
    return [LocalSegment(path, newest_possible_ts(path.name) if path != log else float("inf"))
            for path in served_files(log)]


def local_source(request_log: Path) -> LogSource:
    """This host's files: the request log, its rotated (and shipped) segments, and feedback beside them."""
    return LogSource(str(request_log), lambda: local_segments(request_log),
                     lambda: local_segments(feedback_path(request_log)))


def bucket_source(url: str, client=None) -> LogSource:
    """Every host's shipped segments under `url` (s3://bucket/prefix), oldest first by the time each was closed."""
    location, client = Location.parse(url), client or s3_client()

    def segments(kind: str) -> list[Segment]:
        found = [BucketSegment(client, location, key, newest_possible_ts(key.rsplit("/", 1)[-1]))
                 for key in list_keys(client, location, kind) if key.endswith(".jsonl")]
        return sorted(found, key=lambda segment: (segment.newest, segment.key))

    return LogSource(f"{url} ({SERVED_KIND}/ and {FEEDBACK_KIND}/, every host)", lambda: segments(SERVED_KIND),
                     lambda: segments(FEEDBACK_KIND))


def log_source(serve: ServeParams) -> LogSource:
    """The bucket when the service ships its log (serve.ship_to), else the local file serve.request_log names."""
    if serve.ship_to:
        return bucket_source(serve.ship_to)
    if not serve.request_log:
        raise TorchshipError("serve.request_log is empty, so the service keeps no log to monitor: set it "
                             "(default data/serve/requests.jsonl) and serve traffic first.")
    return local_source(Path(serve.request_log))
