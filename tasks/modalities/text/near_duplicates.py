"""Exact and near duplicates among texts, fast enough for every prepare (40,000 tweets in about a second).

Exact: the sha256 of the text after Unicode (NFKC) and whitespace normalisation. Near: the Jaccard similarity of the
two texts' sets of word pairs, after case folding and with punctuation dropped (a retweet with another link, a
ticket with one word changed). Candidates come from MinHash signatures banded for locality-sensitive hashing
(BANDS x ROWS hashes: a pair at Jaccard 0.8 is a candidate with probability 0.9996, one at 0.3 with 0.05); every
candidate's Jaccard is then computed exactly, so a reported pair is never a hashing accident.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

import numpy as np

BANDS, ROWS = 20, 5
MAX_PEERS = 32             # candidates per text and band: a bucket of hundreds is compared along its order only
PUNCTUATION = re.compile(r"[^\w\s]+")
PAIR = np.uint64(1 << 31)  # a word pair's id: first * PAIR + second (word ids are below 2**31)


def normalised(text: str) -> str:
    """What an exact copy shares: NFKC, runs of whitespace as one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def content_hash(text: str) -> str:
    return hashlib.sha256(normalised(text).encode("utf-8", "surrogatepass")).hexdigest()


def near_key(text: str) -> str:
    """What a near copy is compared on: NFKC, case-folded, punctuation dropped, whitespace collapsed."""
    return " ".join(PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split())


def _word_pairs(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every key's word-pair ids (a one-word key: that word alone), flat, and where each key's ids start."""
    import pandas as pd

    words = [key.split() for key in keys]
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    ids = pd.factorize(pd.Series([word for split in words for word in split], dtype=object))[0].astype(np.uint64)
    ends = np.cumsum(lengths)
    last = np.zeros(len(ids), dtype=bool)
    last[ends - 1] = True   # a key's last word starts no pair, except as a one-word key's only id
    follower = np.append(ids[1:], np.uint64(0))
    pairs = np.where(last, ids * PAIR + (PAIR - np.uint64(1)), ids * PAIR + follower)
    keep = ~last | (lengths == 1)[np.repeat(np.arange(len(keys)), lengths)]
    counts = np.add.reduceat(keep.astype(np.int64), ends - lengths)
    return pairs[keep], np.concatenate([[0], np.cumsum(counts)[:-1]])


def _signatures(flat: np.ndarray, starts: np.ndarray, seed: int) -> np.ndarray:
    """(n, BANDS*ROWS) MinHash signatures: multiply-shift hashes of every shingle, the minimum per text."""
    rng = np.random.default_rng(seed)
    multipliers = rng.integers(1, 2**63, BANDS * ROWS, dtype=np.uint64) | np.uint64(1)
    offsets = rng.integers(0, 2**63, BANDS * ROWS, dtype=np.uint64)
    signatures = np.empty((len(starts), BANDS * ROWS), dtype=np.uint64)
    with np.errstate(over="ignore"):   # the hash family wraps around 2**64 by design
        for k in range(BANDS * ROWS):
            signatures[:, k] = np.minimum.reduceat((multipliers[k] * flat + offsets[k]) >> np.uint64(32), starts)
    return signatures


def _candidates(signatures: np.ndarray) -> np.ndarray:
    """(m, 2) index pairs (low, high) that share a whole band of their signatures."""
    weights = np.uint64(0x9E3779B97F4A7C15) ** np.arange(1, ROWS + 1, dtype=np.uint64)
    found = []
    with np.errstate(over="ignore"):
        for band in range(BANDS):
            keys = (signatures[:, band * ROWS:(band + 1) * ROWS] * weights).sum(axis=1)
            order = np.argsort(keys, kind="stable")
            ranked = keys[order]
            for step in range(1, MAX_PEERS + 1):
                same = np.flatnonzero(ranked[step:] == ranked[:-step])
                if not len(same):
                    break
                found.append(np.stack([order[same], order[same + step]], axis=1))
    if not found:
        return np.empty((0, 2), dtype=np.int64)
    pairs = np.sort(np.concatenate(found), axis=1)
    return np.unique(pairs, axis=0)


def similar_keys(keys: Sequence[str], threshold: float, seed: int = 0) -> list[tuple[int, int, float]]:
    """(i, j, Jaccard) for the distinct `keys` (i < j) whose word-pair sets overlap at least `threshold`."""
    indices = [i for i, key in enumerate(keys) if key]
    if len(indices) < 2:
        return []
    flat, starts = _word_pairs([keys[i] for i in indices])
    ends = np.append(starts[1:], len(flat))
    signatures = _signatures(flat, starts, seed)
    pairs = _candidates(signatures)
    # the signatures' estimate first (a cheap filter, generous by 0.2), then the exact Jaccard of the two sets
    estimate = (signatures[pairs[:, 0]] == signatures[pairs[:, 1]]).mean(axis=1)
    found = []
    for a, b in pairs[estimate >= threshold - 0.2]:
        left, right = np.unique(flat[starts[a]:ends[a]]), np.unique(flat[starts[b]:ends[b]])
        shared = len(np.intersect1d(left, right, assume_unique=True))
        jaccard = shared / (len(left) + len(right) - shared)
        if jaccard >= threshold:
            found.append((indices[a], indices[b], round(float(jaccard), 4)))
    return found


def split_rank(splits: Sequence[str | None]) -> np.ndarray:
    """Each split's order: train first, then val, then holdout, then any other name alphabetically."""
    known = {"train": 0, "val": 1, "holdout": 2}
    others = sorted({s for s in splits if s not in known and s is not None})
    order = {**known, **{name: 3 + i for i, name in enumerate(others)}}
    return np.array([order.get(s, 0) if s is not None else 0 for s in splits], dtype=np.int64)


def cross_split_near_duplicates(texts: Sequence[str | None], splits: Sequence[str | None], threshold: float,
                                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """For each text, one near duplicate in an earlier split (train < val < holdout: the later copy is the leak),
    as (partner index or -1, its Jaccard or NaN). Texts that are None take no part."""
    keys = ["" if t is None else near_key(t) for t in texts]
    distinct, key_of = np.unique(np.array(keys, dtype=object), return_inverse=True)
    rank = split_rank(splits)
    # per distinct key: its earliest member (by split, then position)
    best = np.full(len(distinct), -1, dtype=np.int64)
    for i in np.lexsort((np.arange(len(texts)), rank))[::-1]:
        best[key_of[i]] = i
    neighbours: dict[int, list[tuple[int, float]]] = {}
    for a, b, jaccard in similar_keys(list(distinct), threshold, seed):
        neighbours.setdefault(a, []).append((b, jaccard))
        neighbours.setdefault(b, []).append((a, jaccard))
    partner = np.full(len(texts), -1, dtype=np.int64)
    similarity = np.full(len(texts), np.nan)
    for i, key in enumerate(key_of):
        if not keys[i]:
            continue
        options = [(best[key], 1.0)] + [(best[k], j) for k, j in neighbours.get(int(key), [])]
        earlier = [(rank[p], -j, p) for p, j in options if rank[p] < rank[i]]
        if earlier:
            _, negative, partner[i] = min(earlier)
            similarity[i] = -negative
    return partner, similarity


def near_duplicate_groups(texts: Sequence[str], threshold: float, seed: int = 0) -> np.ndarray:
    """A group id per text, near duplicates (and their chains) in one group: split by group and none leaks."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    keys = [near_key(t) for t in texts]
    distinct, key_of = np.unique(np.array(keys, dtype=object), return_inverse=True)
    pairs = similar_keys(list(distinct), threshold, seed)
    rows = np.array([a for a, _, _ in pairs], dtype=np.int64)
    columns = np.array([b for _, b, _ in pairs], dtype=np.int64)
    graph = coo_matrix((np.ones(len(pairs)), (rows, columns)), shape=(len(distinct), len(distinct)))
    return connected_components(graph, directed=False)[1][key_of]
