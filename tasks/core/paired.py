"""Two variants compared on the same rows: an exact paired test of an accuracy drop (McNemar's, on the rows where
exactly one of them is right), the rows a drop threshold needs to be judged, and a paired permutation test of the
PSI between their predicted classes. Plain numbers in, plain numbers out (the canary's step judge reads them;
tasks/core/metrics.py paired_bootstrap is bless's interval on a whole holdout, too slow to re-run at every look)."""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

PSI_FLOOR = 1e-4   # a class one side never predicted: its share is floored so PSI stays finite (and large)


class PairedDrop(NamedTuple):
    """The first variant's accuracy minus the second's on `rows` paired rows, and the one-sided exact p-value of a
    drop that large or larger if the two were equally accurate."""

    rows: int
    drop: float
    p_value: float


def binomial_upper_tail(successes: int, trials: int) -> float:
    """P(X >= successes) for X ~ Binomial(trials, 1/2), exact (log-space sums: no overflow at any size)."""
    if successes <= 0:
        return 1.0
    if successes > trials:
        return 0.0
    k = np.arange(1, trials + 1)
    log_choose = np.concatenate([[0.0], np.cumsum(np.log(trials - k + 1) - np.log(k))])   # log C(trials, 0..trials)
    tail = log_choose[successes:] - trials * math.log(2.0)
    return float(min(1.0, np.exp(tail - tail.max()).sum() * math.exp(tail.max())))


def paired_accuracy_drop(rows: int, first_only: int, second_only: int) -> PairedDrop:
    """McNemar's exact test: of the rows exactly one variant got right (`first_only` + `second_only`), each would
    be the first's with probability 1/2 if both were equally accurate; rows both got right or wrong say nothing."""
    drop = (first_only - second_only) / rows if rows else 0.0
    return PairedDrop(rows, drop, binomial_upper_tail(first_only, first_only + second_only))


def pairs_needed(max_drop: float, discordant_share: float, alpha: float) -> int:
    """Paired rows on which a drop of exactly `max_drop` is significant at level `alpha` (one-sided), when
    `discordant_share` of the rows have exactly one variant right. On n rows the drop is (b - c) / n with
    b + c = share * n discordant rows; McNemar's test with continuity correction is significant when
    b - c - 1 >= z sqrt(b + c), i.e. (drop n - 1)^2 >= z^2 share n: the larger root of that quadratic in n, and
    never fewer than log2(1/alpha) / drop, the rows on which such a drop can be significant at all (every
    discordant row against one variant). With that many rows a drop of twice `max_drop` is caught with
    probability about 1 - alpha."""
    z2 = NormalDist().inv_cdf(1.0 - alpha) ** 2
    linear = 2 * max_drop + z2 * discordant_share
    root = (linear + math.sqrt(linear * linear - 4 * max_drop ** 2)) / (2 * max_drop ** 2)
    return math.ceil(max(root, math.log2(1.0 / alpha) / max_drop))


def psi_of_counts(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Population stability index between class counts, along the last axis ((..., K) -> (...)); shares floored."""
    e = np.maximum(expected / expected.sum(-1, keepdims=True), PSI_FLOOR)
    a = np.maximum(actual / actual.sum(-1, keepdims=True), PSI_FLOOR)
    return ((a - e) * np.log(a / e)).sum(-1)


def paired_psi_p_value(joint: np.ndarray, observed: float, resamples: int = 5000, seed: int = 0) -> float:
    """P(PSI >= observed) if the two variants were exchangeable on each row. `joint[i, j]`: rows the first variant
    put in class i and the second in class j. Under that null each row's two answers swap with probability 1/2,
    so the rows of cells (i, j) and (j, i) split between them as Binomial(n_ij + n_ji, 1/2)."""
    joint = np.asarray(joint, dtype=np.int64)
    upper = np.triu_indices(len(joint), k=1)
    swappable = joint[upper] + joint.T[upper]                           # (P,) rows answered i/j or j/i
    rng = np.random.default_rng(seed)
    to_upper = rng.binomial(swappable, 0.5, size=(resamples, len(swappable)))   # (R, P)
    shuffled = np.broadcast_to(np.diag(np.diag(joint)), (resamples, *joint.shape)).copy()   # (R, K, K)
    shuffled[:, upper[0], upper[1]] = to_upper
    shuffled[:, upper[1], upper[0]] = swappable - to_upper
    null = psi_of_counts(shuffled.sum(2), shuffled.sum(1))             # first's classes (rows), second's (columns)
    return float((1 + (null >= observed - 1e-12).sum()) / (1 + resamples))
