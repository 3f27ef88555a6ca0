"""serving/batching.py: concurrent requests for one variant share one graph run, each gets exactly its own rows'
probabilities back, a batch never grows past max_rows, a swapped-in variant starts its own batch, and a failed
run fails every request in its batch (and only those)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.batching import MicroBatcher
from tasks.modalities.table.serving import Rows


class FakeVariant:
    """Scores a row as its own number (probabilities [[x, -x]]) and records the size of every run."""

    def __init__(self, fail: bool = False):
        self.runs: list[int] = []
        self.fail = fail

    def score(self, rows: Rows) -> np.ndarray:
        self.runs.append(len(rows))
        if self.fail:
            raise RuntimeError("graph failed")
        x = np.array([r[0] for r in rows.numbers], dtype=np.float32)
        return np.stack([x, -x], axis=1)


def rows_of(*values: float) -> Rows:
    return Rows([(v,) for v in values], [() for _ in values])


async def send(batcher: MicroBatcher, variant, requests: list[tuple[float, ...]]) -> list[np.ndarray]:
    return await asyncio.gather(*(batcher.score(variant, rows_of(*values)) for values in requests))


@pytest.mark.parametrize("wait_s", [0.0, 0.005])
def test_concurrent_requests_share_one_run_and_each_gets_its_own_rows(wait_s):
    variant, batcher = FakeVariant(), MicroBatcher(max_rows=64, max_wait_s=wait_s)
    requests = [(1.0,), (2.0, 3.0), (4.0,), (5.0, 6.0, 7.0)]
    answers = asyncio.run(send(batcher, variant, requests))
    assert variant.runs == [7]
    for values, answer in zip(requests, answers):
        np.testing.assert_array_equal(answer[:, 0], values)


def test_a_batch_is_scored_as_soon_as_it_holds_max_rows():
    variant, batcher = FakeVariant(), MicroBatcher(max_rows=3, max_wait_s=10.0)   # the wait would time the test out
    answers = asyncio.run(asyncio.wait_for(send(batcher, variant, [(1.0,), (2.0,), (3.0,), (4.0, 5.0), (6.0,)]), 1))
    assert variant.runs == [3, 3]
    assert [a[:, 0].tolist() for a in answers] == [[1.0], [2.0], [3.0], [4.0, 5.0], [6.0]]


def test_a_swapped_in_variant_starts_its_own_batch():
    old, new, batcher = FakeVariant(), FakeVariant(), MicroBatcher(max_rows=64, max_wait_s=0.0)

    async def both():
        return await asyncio.gather(batcher.score(old, rows_of(1.0)), batcher.score(new, rows_of(2.0)),
                                    batcher.score(old, rows_of(3.0)))

    answers = asyncio.run(both())
    assert (old.runs, new.runs) == ([2], [1])
    assert [a[0, 0] for a in answers] == [1.0, 2.0, 3.0]


def test_a_failed_run_fails_every_request_of_its_batch():
    broken, batcher = FakeVariant(fail=True), MicroBatcher(max_rows=64, max_wait_s=0.0)

    async def run():
        return await asyncio.gather(*(batcher.score(broken, rows_of(float(i))) for i in range(3)),
                                    return_exceptions=True)

    assert [str(a) for a in asyncio.run(run())] == ["graph failed"] * 3
    assert batcher.batches == 1
