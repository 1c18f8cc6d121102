"""Interval scores: how far a figure from k attempts of a sample of tasks can be trusted.

One module for every interval hx states (the gate's keep rule, the eval suite, the benches, the
report), on ``scipy.stats`` rather than hand-written formulas:

- ``pass_rate``: a pass rate with its Wilson score interval (``binomtest(...).proportion_ci``);
- ``task_mean``: the mean over tasks of each task's mean outcome, with a two-stage bootstrap
  interval: tasks are resampled (which tasks were drawn counts) and, inside each drawn task, its
  attempts (which seeds were drawn counts too);
- ``paired_difference``: candidate minus base over the tasks both played, bootstrapped the same
  way with each task's two arms resampled together, so a task's own difficulty cancels;
- ``keep_rule``: KEEP when that interval lies entirely above 0, DISCARD entirely below, else
  INCONCLUSIVE: intervals compared, never a point estimate plus a margin.

Every bootstrap is seeded: the same outcomes give the same interval.

>>> r = pass_rate(8, 10)
>>> round(r.low, 3), round(r.high, 3)
(0.49, 0.943)
>>> keep_rule(Interval(0.2, 0.05, 0.35, 0.95, "bootstrap")).value
'keep'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy import stats

from hx.errors import IntervalError

CONFIDENCE = 0.95
RESAMPLES = 2000
"""Bootstrap resamples: the interval's ends move by well under 0.01 between seeds at this count."""


@dataclass(frozen=True)
class Interval:
    """An estimate and the interval around it, at a stated confidence, and how it was computed."""

    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    def above(self, value: float = 0.0) -> bool:
        """True when the whole interval lies above ``value``."""
        return self.low > value

    def below(self, value: float = 0.0) -> bool:
        """True when the whole interval lies below ``value``."""
        return self.high < value

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


class Verdict(Enum):
    """What the interval keep rule concludes from the difference candidate - base."""

    KEEP = "keep"
    DISCARD = "discard"
    INCONCLUSIVE = "inconclusive"


def pass_rate(passes: int, attempts: int, confidence: float = CONFIDENCE) -> Interval:
    """``passes`` of ``attempts`` with its Wilson score interval."""
    if attempts <= 0:
        raise IntervalError("a pass rate needs at least one attempt")
    if not 0 <= passes <= attempts:
        raise IntervalError(f"{passes} passes of {attempts} attempts is no pass rate")
    ci = stats.binomtest(passes, attempts).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(passes / attempts, float(ci.low), float(ci.high), confidence, "wilson")


def _arrays(outcomes: Mapping[str, Sequence[float]], what: str) -> dict[str, np.ndarray]:
    out = {task: np.asarray(values, dtype=float) for task, values in outcomes.items()}
    empty = sorted(task for task, values in out.items() if values.size == 0)
    if not out or empty:
        raise IntervalError(f"{what} has no attempts" + (f" for task {empty[0]!r}" if empty else ""))
    return out


def _bootstrap(tasks: int, statistic: Callable[[np.ndarray], float], confidence: float,
               seed: int) -> tuple[float, float]:
    """Percentile interval of ``statistic`` over resampled task indices (``scipy.stats.bootstrap``)."""
    if tasks < 2:  # one task: the task draw cannot vary; the statistic's own attempt resampling still does
        values = [statistic(np.zeros(1, dtype=int)) for _ in range(RESAMPLES)]
        lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
        return float(lo), float(hi)
    res = stats.bootstrap((np.arange(tasks),), statistic, n_resamples=RESAMPLES, vectorized=False,
                          confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def task_mean(outcomes: Mapping[str, Sequence[float]], *, confidence: float = CONFIDENCE,
              seed: int = 0) -> Interval:
    """The mean over tasks of each task's mean outcome, with a bootstrap over tasks and, within each, attempts."""
    arrays = list(_arrays(outcomes, "the outcomes").values())
    inner = np.random.default_rng(seed + 1)

    def statistic(idx: np.ndarray) -> float:
        return float(np.mean([inner.choice(arrays[i], arrays[i].size).mean() for i in idx]))

    low, high = _bootstrap(len(arrays), statistic, confidence, seed)
    return Interval(float(np.mean([a.mean() for a in arrays])), low, high, confidence, "bootstrap tasks+attempts")


def paired_difference(base: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]], *,
                      confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """Candidate minus base, the mean over the tasks both played, with a paired bootstrap (tasks and attempts)."""
    common = sorted(set(base) & set(candidate))
    if not common:
        raise IntervalError("the two arms played no task in common")
    b = _arrays({t: base[t] for t in common}, "the base")
    c = _arrays({t: candidate[t] for t in common}, "the candidate")
    pairs = [(b[t], c[t]) for t in common]
    inner = np.random.default_rng(seed + 1)

    def statistic(idx: np.ndarray) -> float:
        return float(np.mean([inner.choice(pairs[i][1], pairs[i][1].size).mean()
                              - inner.choice(pairs[i][0], pairs[i][0].size).mean() for i in idx]))

    low, high = _bootstrap(len(pairs), statistic, confidence, seed)
    estimate = float(np.mean([cand.mean() - bas.mean() for bas, cand in pairs]))
    return Interval(estimate, low, high, confidence, "paired bootstrap tasks+attempts")


def keep_rule(difference: Interval) -> Verdict:
    """KEEP when the difference's interval lies above 0, DISCARD when below, INCONCLUSIVE when it holds 0."""
    if difference.above(0.0):
        return Verdict.KEEP
    if difference.below(0.0):
        return Verdict.DISCARD
    return Verdict.INCONCLUSIVE


# --- weighted, vectorised: the eval suite's composite over thousands of attempts ------------

_DRAWS_PER_CHUNK = 1_000_000
"""Attempt draws made in one numpy call at most (bounds the memory of a task with many attempts)."""


def _inner_means(arrays: Sequence[np.ndarray], idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each resampled task slot ``idx[r, j]``, the mean of a resample of that task's attempts."""
    means = np.empty(idx.shape, dtype=float)
    for i, values in enumerate(arrays):
        where = np.nonzero(idx == i)
        slots = where[0].size
        if not slots:
            continue
        out = np.empty(slots, dtype=float)
        rows = max(1, _DRAWS_PER_CHUNK // values.size)
        for lo in range(0, slots, rows):
            n = min(rows, slots - lo)
            out[lo:lo + n] = values[rng.integers(0, values.size, size=(n, values.size))].mean(axis=1)
        means[where] = out
    return means


def _task_draws(tasks: int, rng: np.random.Generator) -> np.ndarray:
    """``RESAMPLES`` draws of ``tasks`` task indices with replacement (one task: always itself)."""
    if tasks < 2:
        return np.zeros((RESAMPLES, 1), dtype=int)
    return rng.integers(0, tasks, size=(RESAMPLES, tasks))


def _weights(names: Sequence[str], weights: Mapping[str, float] | None) -> np.ndarray:
    w = np.asarray([1.0 if weights is None else float(weights.get(t, 1.0)) for t in names], dtype=float)
    if (w < 0).any() or not w.sum() > 0:
        raise IntervalError("task weights must be non-negative and not all 0")
    return w


def _percentile(values: np.ndarray, confidence: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def weighted_task_mean(outcomes: Mapping[str, Sequence[float]], weights: Mapping[str, float] | None = None, *,
                       confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """The weight-weighted mean over tasks of each task's mean outcome, bootstrapped over tasks then attempts.

    The same two-stage percentile bootstrap as ``task_mean``, vectorised with numpy so that
    thousands of attempts score in milliseconds; a task missing from ``weights`` weighs 1.

    >>> r = weighted_task_mean({"a": [1, 1, 0], "b": [0, 0, 0]}, {"a": 3.0, "b": 1.0})
    >>> round(r.estimate, 3)
    0.5
    """
    names = sorted(outcomes)
    arrays = [_arrays(outcomes, "the outcomes")[t] for t in names]
    w = _weights(names, weights)
    rng = np.random.default_rng(seed)
    idx = _task_draws(len(arrays), rng)
    ww = w[idx]
    totals = ww.sum(axis=1)
    totals[totals == 0] = 1.0  # a resample of only weight-0 tasks: its mean is 0, not a division by 0
    stat = (_inner_means(arrays, idx, rng) * ww).sum(axis=1) / totals
    low, high = _percentile(stat, confidence)
    estimate = float(np.average([a.mean() for a in arrays], weights=w))
    return Interval(estimate, low, high, confidence, "bootstrap tasks+attempts")


def weighted_paired_difference(base: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]],
                               weights: Mapping[str, float] | None = None, *, confidence: float = CONFIDENCE,
                               seed: int = 0) -> Interval:
    """Candidate minus base, the weight-weighted mean over the tasks both played, with a paired two-stage bootstrap.

    Each resample draws the tasks once for both arms (a task's difficulty cancels) and each
    arm's attempts apart.
    """
    common = sorted(set(base) & set(candidate))
    if not common:
        raise IntervalError("the two arms played no task in common")
    b = _arrays({t: base[t] for t in common}, "the base")
    c = _arrays({t: candidate[t] for t in common}, "the candidate")
    w = _weights(common, weights)
    rng = np.random.default_rng(seed)
    idx = _task_draws(len(common), rng)
    ww = w[idx]
    totals = ww.sum(axis=1)
    totals[totals == 0] = 1.0
    diff = _inner_means([c[t] for t in common], idx, rng) - _inner_means([b[t] for t in common], idx, rng)
    low, high = _percentile((diff * ww).sum(axis=1) / totals, confidence)
    estimate = float(np.average([c[t].mean() - b[t].mean() for t in common], weights=w))
    return Interval(estimate, low, high, confidence, "paired bootstrap tasks+attempts")
