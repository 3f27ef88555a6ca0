"""The canary's quality statistics (tasks/core/paired.py, tasks/canary/analysis.py): the exact paired test, the
pairs a drop needs, the PSI permutation test, and a seeded simulation of whole canaries at the shipped params.yaml
defaults, judged by the real judge_step: an equally accurate challenger is rolled back in at most 5% of 200 runs, a
challenger 5 points less accurate in at least 95%. No servers: each step's labelled rows are drawn, paired."""
from __future__ import annotations

import math
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from tasks.canary.analysis import judge_step, phase_name, requests_wanted, step_alpha
from tasks.config import load_params
from tasks.core.paired import binomial_upper_tail, paired_accuracy_drop, paired_psi_p_value, pairs_needed, psi_of_counts
from tasks.core.verdicts import PairedRows, VariantFigures

RULES = load_params(Path(__file__).resolve().parents[2] / "params.yaml").canary   # as shipped
RUNS = 200
CHAMPION_ACCURACY = 0.76   # the issue's champion
POSITIVE_SHARE = 0.3
# (true class, champion right, challenger right): one cell per row, drawn; the predictions follow (binary classes)
CELLS = list(product((0, 1), (True, False), (True, False)))


def test_the_exact_tail_is_the_binomial_sum():
    for successes, trials in [(0, 0), (3, 5), (9, 10), (40, 60), (700, 1200)]:
        by_hand = sum(math.comb(trials, k) for k in range(successes, trials + 1)) / 2 ** trials
        assert binomial_upper_tail(successes, trials) == pytest.approx(by_hand, rel=1e-9, abs=1e-300)
    assert binomial_upper_tail(11, 10) == 0.0


def test_the_issue_case_is_not_significant_and_asks_for_more_pairs():
    """0.700 against 0.760 on 50 labelled rows (three rows): a step waits for more, it does not roll back."""
    drop = paired_accuracy_drop(50, 5, 2)   # 38 both right, 5 only the champion, 2 only the challenger
    assert drop.drop == pytest.approx(0.06) and drop.p_value > 0.2
    verdict = judge(50, 50, rows_both_right=33, champion_only=5, challenger_only=2, shadow=True)
    assert verdict.status == "short", verdict.reasons
    needed = verdict.statistics.pairs_needed
    assert needed > 50 and f"needs {needed} pairs" in verdict.reasons[0] and "not significant" in verdict.reasons[0]
    assert requests_wanted(verdict, 50, RULES) >= needed


def test_a_significant_drop_beyond_the_threshold_fails_and_a_small_one_passes():
    assert judge(400, 400, rows_both_right=250, champion_only=60, challenger_only=10).status == "fail"
    # significant, but within max_metric_drop: 8 of 2000 rows is 0.004
    small = judge(2000, 2000, rows_both_right=1500, champion_only=12, challenger_only=4)
    assert small.status == "pass" and small.statistics.drop == pytest.approx(0.004), small.reasons


def test_the_pairs_needed_make_a_drop_of_the_threshold_just_significant():
    alpha = step_alpha(RULES)
    for share in (0.05, 0.2, 0.4):
        rows = pairs_needed(RULES.max_metric_drop, share, alpha)
        discordant = round(share * rows)
        first = round((discordant + RULES.max_metric_drop * rows) / 2)   # a drop of max_metric_drop on `rows`
        assert paired_accuracy_drop(rows, first, discordant - first).p_value < alpha * 1.5
        assert paired_accuracy_drop(rows // 2, first // 2, (discordant - first) // 2).p_value > alpha
    # the shipped replay has rows enough for a step's second look at a discordance of 0.2
    assert RULES.requests >= pairs_needed(RULES.max_metric_drop, 0.2, step_alpha(RULES, look=2))


def test_the_psi_permutation_test_tells_a_shift_from_noise():
    shifted = np.array([[30, 25], [0, 5]])   # the challenger moved 25 of the champion's class-0 rows to class 1
    assert paired_psi_p_value(shifted, 1.0) < 0.001
    same = np.array([[40, 3], [3, 14]])      # six rows swapped, as many each way
    assert paired_psi_p_value(same, 0.0) == 1.0
    leaning = np.array([[40, 4], [2, 14]])   # four one way, two the other: what a coin does
    observed = float(psi_of_counts(leaning.sum(1), leaning.sum(0)))
    assert observed > 0 and paired_psi_p_value(leaning, observed) > 0.5


def judge(requests: int, rows: int, rows_both_right: int, champion_only: int, challenger_only: int,
          shadow: bool = False):
    """judge_step on `rows` labelled pairs, all of the true class 0, with these counts of who was right."""
    counts = np.zeros(len(CELLS), np.int64)
    for cell, count in [((0, True, True), rows_both_right), ((0, True, False), champion_only),
                        ((0, False, True), challenger_only),
                        ((0, False, False), rows - rows_both_right - champion_only - challenger_only)]:
        counts[CELLS.index(cell)] = count
    return step_from(counts, requests, "shadow" if shadow else "25%", 0.0 if shadow else 0.25)


def cell_shares(drop: float, discordance: float) -> np.ndarray:
    """P(cell) for CELLS: the champion right on CHAMPION_ACCURACY of rows, only one of the two right on
    `discordance` of them, the challenger `drop` less accurate; the true class independent of correctness."""
    champion_only, challenger_only = (discordance + drop) / 2, (discordance - drop) / 2
    both_right = CHAMPION_ACCURACY - champion_only
    correctness = {(True, True): both_right, (True, False): champion_only, (False, True): challenger_only,
                   (False, False): 1 - both_right - discordance}
    return np.array([(POSITIVE_SHARE if y else 1 - POSITIVE_SHARE) * correctness[(a, b)] for y, a, b in CELLS])


def step_from(counts: np.ndarray, requests: int, phase: str, share: float, look: int = 1):
    """judge_step on the first rows of a drawn stream (`counts`: rows per cell)."""
    classes: dict[str, dict[str, int]] = {}
    right = {"champion": 0, "challenger": 0}
    champion_only = challenger_only = 0
    for (y, a, b), count in zip(CELLS, counts.tolist()):
        first, second = ("yes" if (y == 1) == a else "no"), ("yes" if (y == 1) == b else "no")
        classes.setdefault(first, {})[second] = classes.get(first, {}).get(second, 0) + count
        right["champion"] += a * count
        right["challenger"] += b * count
        champion_only += (a and not b) * count
        challenger_only += (b and not a) * count
    rows = int(counts.sum())
    pairs = PairedRows(rows=rows, classes=classes, labelled=rows, champion_only=champion_only,
                       challenger_only=challenger_only)
    champion_labels = {c: sum(row.values()) for c, row in classes.items()}
    challenger_labels: dict[str, int] = {}
    for row in classes.values():
        for c, n in row.items():
            challenger_labels[c] = challenger_labels.get(c, 0) + n
    figures = [VariantFigures(version=v, requests=requests, p95_ms=2.0, labels=labels, labelled=rows,
                              correct=right[who])
               for v, labels, who in (("1", champion_labels, "champion"), ("2", challenger_labels, "challenger"))]
    return judge_step(phase, share, figures[0], figures[1], RULES, pairs=pairs, look=look)


def simulate_canary(rng: np.random.Generator, shares: np.ndarray) -> str:
    """One canary: each phase fills to min_samples challenger requests (every request is paired: the variant not
    answering shadows it; the replay labels each), then, while short, to what requests_wanted asks, within the
    replay's distinct rows (canary.requests); stops at the first step that does not pass, as run_steps does."""
    phases = ([(0.0, True)] if RULES.shadow else []) + [(share, False) for share in RULES.steps]
    cap = min(RULES.requests, RULES.replay_max_requests)
    for share, shadow in phases:
        stream = rng.choice(len(CELLS), size=cap, p=shares)   # (cap,) each row's cell
        requests, look = RULES.min_samples, 1
        while True:
            rows = min(cap, math.ceil(requests / (1.0 if shadow else share)))
            verdict = step_from(np.bincount(stream[:rows], minlength=len(CELLS)), requests,
                                phase_name(share, shadow), share, look)
            if verdict.status != "short" or rows >= cap:
                break
            requests, look = requests_wanted(verdict, requests, RULES), look + 1
        if verdict.status != "pass":
            return "rolled back" if verdict.status == "fail" else "inconclusive"
    return "promoted"


@pytest.mark.parametrize("discordance", [0.1, 0.2, 0.3])
def test_an_equally_accurate_challenger_is_rarely_rolled_back(discordance):
    shares = cell_shares(0.0, discordance)
    outcomes = [simulate_canary(np.random.default_rng(seed), shares) for seed in range(RUNS)]
    assert outcomes.count("rolled back") <= 0.05 * RUNS, {o: outcomes.count(o) for o in set(outcomes)}
    assert outcomes.count("promoted") >= 0.8 * RUNS, {o: outcomes.count(o) for o in set(outcomes)}


@pytest.mark.parametrize("discordance", [0.1, 0.2, 0.3])
def test_a_challenger_five_points_worse_is_almost_always_rolled_back(discordance):
    shares = cell_shares(0.05, discordance)
    outcomes = [simulate_canary(np.random.default_rng(1000 + seed), shares) for seed in range(RUNS)]
    assert outcomes.count("rolled back") >= 0.95 * RUNS, {o: outcomes.count(o) for o in set(outcomes)}
