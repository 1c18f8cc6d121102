"""The seesaw's per-task test: does a solved task's pass rate fall under the candidate? Sequential, with a stated error.

The gate's seesaw asks, for each task the variant solved, whether the candidate regresses it.
Under a stochastic agent a task passes at some rate, and two attempts say little about it. Two
rules are selectable (a run's ``gate.seesaw``):

- ``retry`` (hx before the sequential rule): a solved task that fails every paired attempt is
  retried on fresh seeds, up to ``2k`` times, and holds at its first pass. Its error rates are
  not stated; it is biased towards shipping (a candidate that halves a task's pass rate is
  let through by any single pass).
- ``sequential`` (the default for new runs): the candidate plays the variant's paired seeds
  (wave 1: the base's attempts are its main rollout's). A task whose candidate pass rate on the
  seeds played so far is at least the base's *holds*. Otherwise base **and** candidate play
  another wave of ``k`` fresh paired seeds, up to ``waves`` waves. After the last wave a task the
  candidate still trails *regresses* when the drop in pass rate is at least ``drop`` (the noise
  threshold: smaller drops are noise at this sample size) and Boschloo's exact test, one-sided,
  gives ``p <= alpha``; else it holds. Both sides play the same number of attempts on the same
  seeds, so an extension is never a retry that only the candidate gets.

Error rates, exact (``operating_characteristic``): the test alone is exact at ``alpha``, but
wave 1's base attempts both select the task (it is solved: the base passed at least once) and
enter the test, so a task that did not change is called regressed somewhat more often than
``alpha``: at the defaults up to 6.2 % with ``k = 2`` (6.1 % at a pass rate of 0.2) and 7.2 % with
``k = 3`` (7.0 % at 0.2), the worst at low pass rates, where a solved task's base was luckier than
its rate. The probability that a drop of a given size is caught depends on the base's pass rate
and the attempts; both are stated in docs/aegis.md (``bench/gate_oc.py`` prints them).

>>> rule = SequentialRule()
>>> decide(rule, Tries(2, 2), Tries(2, 2), waves=1), decide(rule, Tries(2, 1), Tries(2, 0), waves=1)
('held', 'continue')
>>> decide(rule, Tries(6, 6), Tries(6, 0), waves=3), decide(rule, Tries(6, 3), Tries(6, 2), waves=3)
('regressed', 'held')
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from math import comb
from typing import Literal

from scipy.stats import boschloo_exact

SeesawMode = Literal["retry", "sequential"]
SEESAW_MODES: tuple[SeesawMode, ...] = ("sequential", "retry")
Decision = Literal["held", "regressed", "continue"]


@dataclass(frozen=True)
class Tries:
    """Fresh attempts of one task: how many ran, how many passed."""

    attempts: int
    passes: int

    def __add__(self, other: Tries) -> Tries:
        """Both counts added."""
        return Tries(self.attempts + other.attempts, self.passes + other.passes)

    @property
    def rate(self) -> float:
        """The pass rate (0 for no attempts)."""
        return self.passes / self.attempts if self.attempts else 0.0


@dataclass(frozen=True)
class SequentialRule:
    """The sequential rule's three numbers (a run's ``gate.drop``, ``gate.alpha``, ``gate.waves``)."""

    drop: float = 0.25
    """The smallest fall in a task's pass rate that counts as a regression (smaller is noise)."""
    alpha: float = 0.05
    """The one-sided level of Boschloo's exact test; an unchanged solved task is called regressed a little more
    often (6-7 % at 0.05: wave 1's base attempts also chose the task, ``operating_characteristic``)."""
    waves: int = 3
    """The most waves of ``k`` paired seeds a trailing task plays (the first is the base's main rollout's)."""


def trailing_p(base: Tries, candidate: Tries) -> float:
    """One-sided p of Boschloo's exact test that the candidate's pass rate is below the base's."""
    return _boschloo(candidate.passes, candidate.attempts, base.passes, base.attempts)


@cache
def _boschloo(c: int, nc: int, b: int, nb: int) -> float:
    # Boschloo's test is exact and uniformly more powerful than Fisher's, which at six attempts a side
    # cannot call even 0 of 6 against 3 of 6 (p 0.09): the candidate that breaks a task must be caught.
    root = logging.getLogger()
    root.addFilter(_scipy_chatter)  # scipy's exact tests log their search bounds at INFO on the root logger
    try:
        # scipy's columns are the two independent samples (passes over fails): the candidate's, then the base's;
        # "less" is the alternative that the first column's pass rate is below the second's
        return float(boschloo_exact([[c, b], [nc - c, nb - b]], alternative="less").pvalue)
    finally:
        root.removeFilter(_scipy_chatter)


def _scipy_chatter(record: logging.LogRecord) -> bool:
    """Drop the root logger's records that come from inside scipy."""
    return "scipy" not in record.pathname


def decide(rule: SequentialRule, base: Tries, candidate: Tries, *, waves: int) -> Decision:
    """One solved task after ``waves`` waves of paired seeds: ``held``, ``regressed`` or ``continue`` (a wave more)."""
    if candidate.rate >= base.rate:
        return "held"
    if waves < rule.waves:
        return "continue"
    trails = base.rate - candidate.rate >= rule.drop - 1e-12 and trailing_p(base, candidate) <= rule.alpha
    return "regressed" if trails else "held"


def operating_characteristic(rule: SequentialRule, k: int, p_base: float, p_candidate: float) -> float:
    """The exact chance the rule calls a solved task regressed, when base and candidate pass at these rates.

    The task is solved: its base passed at least once in the first wave of ``k``. Every wave
    is ``k`` independent attempts a side (the paired seeds of a stochastic agent).
    """
    return _oc(rule, k, round(p_base, 9), round(p_candidate, 9))


@cache
def _oc(rule: SequentialRule, k: int, pb: float, pc: float) -> float:
    def binom(n: int, p: float) -> list[float]:
        return [comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(n + 1)]

    wave_b, wave_c = binom(k, pb), binom(k, pc)
    solved = 1 - wave_b[0]
    if solved <= 0:
        return 0.0
    # states: (base passes, candidate passes) after the waves so far, with their probability
    states = {(b, c): wave_b[b] * wave_c[c] / solved for b in range(1, k + 1) for c in range(k + 1)}
    regressed = 0.0
    for wave in range(1, rule.waves + 1):
        n = wave * k
        going: dict[tuple[int, int], float] = {}
        for (b, c), p in states.items():
            verdict = decide(rule, Tries(n, b), Tries(n, c), waves=wave)
            if verdict == "regressed":
                regressed += p
            elif verdict == "continue":
                for i, pi in enumerate(wave_b):
                    for j, pj in enumerate(wave_c):
                        going[b + i, c + j] = going.get((b + i, c + j), 0.0) + p * pi * pj
        states = going
    return regressed
