"""The pure part of ``gate_fidelity.py``: per (ship, task) verdicts, the rates counted from them, and the seed sizing.

A pair is one solved task of the base under one shipped (or rejected) harness, re-run on ``N``
fresh seeds a side. It *regressed* when its pass rate fell by at least ``drop`` and the one-sided
upper bound of the difference (Newcombe's hybrid score interval, ``hx.intervals.rate_difference``)
lies below zero. The sizing is the normal approximation of a one-sided test of two independent
binomial proportions at level ``alpha``.

>>> judge(Tries(20, 20), Tries(20, 10)).regressed, judge(Tries(20, 20), Tries(20, 18)).regressed
(True, False)
>>> seeds_for_power(1.0, 0.25), seeds_for_power(0.5, 0.25)
(21, 46)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scipy.stats import norm

from hx.gate.sequential import Tries
from hx.intervals import Interval, pass_rate, rate_difference

DROP = 0.25
"""The smallest fall in a task's pass rate that counts as a regression."""
ALPHA = 0.05
"""One-sided level of the per-pair test."""
POWER = 0.80
"""The power the seeds are sized for, at a drop of ``DROP``."""
FLOOR = 20
"""Fewest fresh seeds a side, whatever the sizing says (the issue's "at least 20 each")."""


@dataclass(frozen=True)
class PairVerdict:
    """One (ship, task) pair re-run: both sides' attempts, the difference with its one-sided bound, the call."""

    base: Tries
    after: Tries
    difference: Interval
    """After minus base, two-sided at ``1 - 2 alpha``: its ``high`` is the one-sided upper bound at ``1 - alpha``."""
    regressed: bool


def judge(base: Tries, after: Tries, *, drop: float = DROP, alpha: float = ALPHA) -> PairVerdict:
    """Regressed: a fall of at least ``drop`` whose one-sided ``1 - alpha`` upper bound is below zero."""
    diff = rate_difference((after.passes, after.attempts), (base.passes, base.attempts), confidence=1 - 2 * alpha)
    fell = base.rate - after.rate >= drop - 1e-12
    return PairVerdict(base, after, diff, fell and diff.below(0.0))


@dataclass(frozen=True)
class Rate:
    """A count over a total, with its Wilson interval (None when the total is 0)."""

    count: int
    total: int
    interval: Interval | None

    def __str__(self) -> str:
        return (f"{self.count}/{self.total} = {self.interval}" if self.interval is not None
                else f"{self.count}/{self.total} (nothing to count)")


def rate(count: int, total: int) -> Rate:
    """``count`` of ``total`` with its 95 % Wilson interval."""
    return Rate(count, total, pass_rate(count, total) if total else None)


def shipped_regression_rate(verdicts: Iterable[PairVerdict]) -> Rate:
    """Regressed pairs over all pairs."""
    seen = list(verdicts)
    return rate(sum(v.regressed for v in seen), len(seen))


def fine_rate(rejected: Sequence[Sequence[PairVerdict]]) -> Rate:
    """Of the rejected candidates, each given as its pairs, those with no pair regressed ("would have been fine")."""
    return rate(sum(not any(v.regressed for v in pairs) for pairs in rejected), len(rejected))


def _spread(p_base: float, drop: float) -> tuple[float, float, float]:
    """The null and alternative standard deviations of one attempt a side, and the alternative's drop."""
    p2 = max(p_base - drop, 0.0)
    mean = (p_base + p2) / 2
    return math.sqrt(2 * mean * (1 - mean)), math.sqrt(p_base * (1 - p_base) + p2 * (1 - p2)), p_base - p2


def seeds_for_power(p_base: float, drop: float = DROP, *, alpha: float = ALPHA, power: float = POWER) -> int:
    """Seeds a side for a one-sided level-``alpha`` test to see a fall from ``p_base`` by ``drop`` with ``power``."""
    null, alt, delta = _spread(p_base, drop)
    if delta <= 0:
        return 0
    return math.ceil(float((norm.ppf(1 - alpha) * null + norm.ppf(power) * alt) / delta) ** 2)


def power_at(p_base: float, drop: float, seeds: int, *, alpha: float = ALPHA, counted: float = 0.0) -> float:
    """The chance a fall from ``p_base`` by ``drop`` is called with ``seeds`` a side (normal approximation).

    The test alone by default; with ``counted`` > 0 the pair's rule, which also asks the observed
    fall to be at least ``counted`` (so a true fall of exactly ``counted`` is called about half the time).
    """
    null, alt, delta = _spread(p_base, drop)
    if delta <= 0 or seeds <= 0:
        return 0.0
    needed = max(norm.ppf(1 - alpha) * null / math.sqrt(seeds), counted - 1e-12)
    if alt == 0:
        return 1.0 if delta >= needed else 0.0
    return float(norm.cdf((delta - needed) * math.sqrt(seeds) / alt))


def smallest_drop(p_base: float, seeds: int, *, alpha: float = ALPHA, power: float = POWER,
                  counted: float = 0.0) -> float | None:
    """The smallest fall from ``p_base`` called with ``power`` at ``seeds`` a side (None: not even a fall to 0);
    ``counted`` as in ``power_at``."""
    if power_at(p_base, p_base, seeds, alpha=alpha, counted=counted) < power:
        return None
    low, high = 0.0, p_base
    for _ in range(40):  # bisection: power grows with the drop
        mid = (low + high) / 2
        low, high = (low, mid) if power_at(p_base, mid, seeds, alpha=alpha, counted=counted) >= power else (mid, high)
    return high


def choose_seeds(base_rates: Iterable[float], drop: float = DROP, *, alpha: float = ALPHA, power: float = POWER,
                 floor: int = FLOOR) -> int:
    """Seeds a side: enough for ``power`` at every base rate seen from which a fall of ``drop`` is possible."""
    return max([floor, *(seeds_for_power(p, drop, alpha=alpha, power=power) for p in base_rates if p >= drop)])
