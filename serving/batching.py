"""Dynamic micro-batching: the rows of concurrent requests for one variant scored in one ONNX Runtime run.

Runs on the event loop: a request's accepted rows join the variant's open batch and the request awaits its
slice of the probabilities. A batch is scored when it reaches `max_rows`, or `max_wait_s` after its first
request (0: at the loop's next turn, so it holds what arrived together and never waits for more). A graph
run costs a fixed overhead per call (tens of µs for a 64-column raw graph) that a batch pays once."""
from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from serving.variants import Variant


class Batch:
    """The rows gathered so far for one variant, and each request's future and offset."""

    def __init__(self, variant: Variant):
        self.variant = variant
        self.rows = None   # the first request's decoded items (a dataclass of lists: its modality's), then extended
        self.waiting: list[tuple[asyncio.Future, int, int]] = []   # (future, first row, end row)
        self.timer: asyncio.Handle | None = None

    def add(self, rows, future: asyncio.Future) -> None:
        if self.rows is None:   # a copy: extending must never grow the first request's own rows
            self.rows = dataclasses.replace(rows, **{f.name: list(getattr(rows, f.name))
                                                     for f in dataclasses.fields(rows)})
            self.waiting.append((future, 0, len(rows)))
            return
        start = len(self.rows)
        self.rows.extend(rows)
        self.waiting.append((future, start, len(self.rows)))

    def score(self) -> None:
        """One run for every request in the batch; each future gets its rows' probabilities (or the error)."""
        try:
            probabilities: np.ndarray = self.variant.score(self.rows)
        except Exception as exc:
            for future, _, _ in self.waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, start, end in self.waiting:
            if not future.done():   # its client may have gone away (the task was cancelled)
                future.set_result(probabilities[start:end])


class MicroBatcher:
    """Open batches by variant; `score()` is what a request awaits instead of scoring alone."""

    def __init__(self, max_rows: int, max_wait_s: float):
        self.max_rows = max_rows
        self.max_wait_s = max_wait_s
        self._open: dict[int, Batch] = {}   # by id(variant): a swapped-in variant starts its own batch
        self.batches = 0                    # scored batches and their rows: the mean batch size, for the bench
        self.rows = 0

    async def score(self, variant: Variant, rows) -> np.ndarray:
        """Probabilities (N, C) of `rows`, scored in a batch with whatever concurrent requests joined it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        batch = self._open.get(id(variant))
        if batch is None:
            batch = self._open[id(variant)] = Batch(variant)
            batch.timer = (loop.call_soon(self._flush, batch) if self.max_wait_s <= 0
                           else loop.call_later(self.max_wait_s, self._flush, batch))
        batch.add(rows, future)
        if len(batch.rows) >= self.max_rows:
            batch.timer.cancel()
            self._flush(batch)
        return await future

    def _flush(self, batch: Batch) -> None:
        if self._open.get(id(batch.variant)) is batch:
            del self._open[id(batch.variant)]
        self.batches += 1
        self.rows += len(batch.rows)
        batch.score()
