"""Interval scores: how far a figure from k attempts of a sample of tasks can be trusted.

One module for every interval hx states (the gate's keep rule, the eval suite, the benches, the
report), on ``scipy.stats`` rather than hand-written formulas:

- ``pass_rate``: a pass rate with its Wilson score interval (``binomtest(...).proportion_ci``);
- ``task_mean``: the mean over tasks of each task's mean outcome, with a two-stage bootstrap
  interval: tasks are resampled (which tasks were drawn counts) and, inside each drawn task, its
  attempts (which seeds were drawn counts too);
- ``paired_difference``: candidate minus base over the tasks both played, bootstrapped the same
  way with each task's two arms resampled together, so a task's own difficulty cancels;
- ``ordinal_median``: the median of a judge's ordinal grades with a distribution-free interval
  (order statistics, the sign test's), since grades have no mean worth stating;
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
DIGITS = 12
"""Decimal places an interval's ends are rounded to: sums of a few thousand outcomes leave errors near 1e-17,
and an end that is 0 must read 0, not 5e-18 (which would put it "above 0" and flip the keep rule)."""
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


def _exact(value: float) -> float:
    """``value`` without the floating-point noise of the sums it came from (``-0.0`` read as 0)."""
    return round(float(value), DIGITS) + 0.0


def _arrays(outcomes: Mapping[str, Sequence[float]], what: str) -> dict[str, np.ndarray]:
    out = {task: np.asarray(values, dtype=float) for task, values in outcomes.items()}
    empty = sorted(task for task, values in out.items() if values.size == 0)
    if not out or empty:
        raise IntervalError(f"{what} has no attempts" + (f" for task {empty[0]!r}" if empty else ""))
    return out


class _Attempts:
    """Every task's attempts in one flat array, so a resample of tasks and attempts is a few numpy calls."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.sizes = np.array([a.size for a in arrays], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        self.flat = np.concatenate(arrays) if arrays else np.zeros(0)
        self.means = np.array([a.mean() for a in arrays])

    def resampled_sums(self, idx: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """For each drawn task in ``idx`` (any shape), the sum and the sum of squares of its attempts drawn again."""
        flat_idx = idx.reshape(-1)
        n = self.sizes[flat_idx]
        owner = np.repeat(np.arange(flat_idx.size), n)
        offsets = (rng.random(owner.size) * n[owner]).astype(np.int64)
        picked = self.flat[self.starts[flat_idx][owner] + offsets]
        sums = np.bincount(owner, weights=picked, minlength=flat_idx.size).reshape(idx.shape)
        squares = np.bincount(owner, weights=picked * picked, minlength=flat_idx.size).reshape(idx.shape)
        return sums, squares

    def resampled_means(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """For each drawn task in ``idx`` (any shape), the mean of its attempts drawn again with replacement."""
        means: np.ndarray = self.resampled_sums(idx, rng)[0] / self.sizes[idx]
        return means


def _weights(tasks: Sequence[str], weights: Mapping[str, float] | None) -> np.ndarray:
    if weights is None:
        return np.ones(len(tasks))
    missing = [t for t in tasks if t not in weights]
    if missing:
        raise IntervalError(f"no weight for task {missing[0]!r}")
    out = np.array([float(weights[t]) for t in tasks])
    if not np.all(np.isfinite(out)) or np.any(out <= 0):
        raise IntervalError("task weights must be positive numbers")
    return out


def _bootstrap(tasks: int, statistic: Callable[[np.ndarray], np.ndarray], confidence: float,
               seed: int, per_resample: int) -> tuple[float, float]:
    """Percentile interval of a vectorised ``statistic`` over resampled task indices (``scipy.stats.bootstrap``).

    ``statistic`` gets a (resamples, tasks) array of task indices and returns one value a row;
    resamples go in batches of about a million drawn attempts (``per_resample`` attempts each).
    """
    batch = max(1, min(RESAMPLES, 1_000_000 // max(1, per_resample)))
    if tasks < 2:  # one task: the task draw cannot vary; the statistic's own attempt resampling still does
        values = np.concatenate([statistic(np.zeros((min(batch, RESAMPLES - i), 1), dtype=np.int64))
                                 for i in range(0, RESAMPLES, batch)])
        lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
        return _exact(lo), _exact(hi)

    def vectorised(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = np.moveaxis(np.asarray(idx, dtype=np.int64), axis, -1)
        return statistic(rows.reshape(-1, rows.shape[-1])).reshape(rows.shape[:-1])

    res = stats.bootstrap((np.arange(tasks),), vectorised, n_resamples=RESAMPLES, vectorized=True, batch=batch,
                          confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    return _exact(res.confidence_interval.low), _exact(res.confidence_interval.high)


def task_mean(outcomes: Mapping[str, Sequence[float]], *, weights: Mapping[str, float] | None = None,
              confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """The (weighted) mean over tasks of each task's mean outcome, with a bootstrap over tasks, then attempts."""
    arrays = _arrays(outcomes, "the outcomes")
    attempts = _Attempts(list(arrays.values()))
    w = _weights(list(arrays), weights)
    inner = np.random.default_rng(seed + 1)

    def statistic(idx: np.ndarray) -> np.ndarray:
        ww = w[idx]
        values: np.ndarray = (attempts.resampled_means(idx, inner) * ww).sum(axis=-1) / ww.sum(axis=-1)
        return values

    low, high = _bootstrap(len(arrays), statistic, confidence, seed, int(attempts.sizes.sum()))
    estimate = _exact((attempts.means * w).sum() / w.sum())
    return Interval(estimate, low, high, confidence, "bootstrap tasks+attempts")


def paired_difference(base: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]], *,
                      weights: Mapping[str, float] | None = None, confidence: float = CONFIDENCE,
                      seed: int = 0) -> Interval:
    """Candidate minus base, the (weighted) mean over the tasks both played, with a paired bootstrap."""
    common = sorted(set(base) & set(candidate))
    if not common:
        raise IntervalError("the two arms played no task in common")
    b = _arrays({t: base[t] for t in common}, "the base")
    c = _arrays({t: candidate[t] for t in common}, "the candidate")
    base_attempts, cand_attempts = _Attempts([b[t] for t in common]), _Attempts([c[t] for t in common])
    w = _weights(common, weights)
    inner = np.random.default_rng(seed + 1)

    def statistic(idx: np.ndarray) -> np.ndarray:
        ww = w[idx]
        gain = cand_attempts.resampled_means(idx, inner) - base_attempts.resampled_means(idx, inner)
        values: np.ndarray = (gain * ww).sum(axis=-1) / ww.sum(axis=-1)
        return values

    per = int(base_attempts.sizes.sum() + cand_attempts.sizes.sum())
    low, high = _bootstrap(len(common), statistic, confidence, seed, per)
    estimate = _exact(((cand_attempts.means - base_attempts.means) * w).sum() / w.sum())
    return Interval(estimate, low, high, confidence, "paired bootstrap tasks+attempts")


def _common(arms: Sequence[Mapping[str, Sequence[float]]], names: Sequence[str]) -> tuple[list[str], list[_Attempts]]:
    """The tasks every arm played, and each arm's attempts on them."""
    common = sorted(set.intersection(*(set(arm) for arm in arms)))
    if not common:
        raise IntervalError("the two arms played no task in common" if len(arms) == 2
                            else "the arms played no task in common")
    return common, [_Attempts(list(_arrays({t: arm[t] for t in common}, name).values()))
                    for arm, name in zip(arms, names, strict=True)]


def standardised_difference(base: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]], *,
                            confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """The paired difference over the spread of all the outcomes (a standardised effect size), bootstrapped alike.

    The spread is the standard deviation of both arms' outcomes pooled; when every outcome is the
    same the effect is 0 (no difference to scale).
    """
    common, (b, c) = _common([base, candidate], ["the base", "the candidate"])
    inner = np.random.default_rng(seed + 1)

    def size(diff: np.ndarray, total: np.ndarray, squares: np.ndarray, count: np.ndarray) -> np.ndarray:
        mean = total / count
        spread = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
        safe = np.where(spread > 1e-12, spread, 1.0)
        values: np.ndarray = np.where(spread > 1e-12, diff / safe, 0.0)
        return values

    def statistic(idx: np.ndarray) -> np.ndarray:
        (bs, bq), (cs, cq) = b.resampled_sums(idx, inner), c.resampled_sums(idx, inner)
        nb, nc = b.sizes[idx], c.sizes[idx]
        diff = (cs / nc - bs / nb).mean(axis=-1)
        return size(diff, (bs + cs).sum(axis=-1), (bq + cq).sum(axis=-1), (nb + nc).sum(axis=-1))

    per = int(b.sizes.sum() + c.sizes.sum())
    low, high = _bootstrap(len(common), statistic, confidence, seed, per)
    everything = np.concatenate((b.flat, c.flat))
    estimate = size(np.asarray((c.means - b.means).mean()), np.asarray(everything.sum()),
                    np.asarray((everything ** 2).sum()), np.asarray(float(everything.size)))
    return Interval(_exact(float(estimate)), low, high, confidence, "standardised paired bootstrap tasks+attempts")


def contrast(arms: Sequence[Mapping[str, Sequence[float]]], weights: Sequence[float], *,
             confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """The weighted sum of the arms' means (e.g. a 2x2 interaction: weights 1, -1, -1, 1), paired over tasks.

    Tasks every arm played are resampled and, inside each, every arm's attempts.
    """
    if len(arms) != len(weights) or not arms:
        raise IntervalError("a contrast needs one weight per arm")
    common, attempts = _common(arms, [f"arm {n}" for n in range(len(arms))])
    coefficients = [float(w) for w in weights]
    inner = np.random.default_rng(seed + 1)

    def statistic(idx: np.ndarray) -> np.ndarray:
        total = sum(w * arm.resampled_means(idx, inner) for w, arm in zip(coefficients, attempts, strict=True))
        values: np.ndarray = np.asarray(total).mean(axis=-1)
        return values

    per = int(sum(arm.sizes.sum() for arm in attempts))
    low, high = _bootstrap(len(common), statistic, confidence, seed, per)
    estimate = _exact(np.sum([w * arm.means for w, arm in zip(coefficients, attempts, strict=True)], axis=0).mean())
    return Interval(estimate, low, high, confidence, "paired bootstrap tasks+attempts")


def ordinal_median(scores: Sequence[int], confidence: float = CONFIDENCE) -> Interval:
    """The median of ordinal scores (a judge's 1-5 grades) with a distribution-free order-statistic interval.

    Ordinal grades have no meaningful mean or spread, so the figure is the median and the interval
    the pair of order statistics that covers it with at least ``confidence`` (``scipy.stats.binom``:
    the sign-test interval). With too few scores for that coverage it is the whole observed range.
    """
    values = np.sort(np.asarray(scores, dtype=float))
    n = values.size
    if n == 0:
        raise IntervalError("a median of ordinal scores needs at least one score")
    k = int(stats.binom.ppf((1 - confidence) / 2, n, 0.5))  # largest k with P(X < k) <= alpha/2, roughly
    while k > 0 and stats.binom.cdf(k - 1, n, 0.5) > (1 - confidence) / 2:
        k -= 1
    low, high = (values[k - 1], values[n - k]) if k >= 1 else (values[0], values[-1])
    return Interval(float(np.median(values)), float(low), float(high), confidence, "order statistics (sign test)")


def keep_rule(difference: Interval) -> Verdict:
    """KEEP when the difference's interval lies above 0, DISCARD when below, INCONCLUSIVE when it holds 0."""
    if difference.above(0.0):
        return Verdict.KEEP
    if difference.below(0.0):
        return Verdict.DISCARD
    return Verdict.INCONCLUSIVE


def rate_difference(candidate: tuple[int, int], base: tuple[int, int], confidence: float = CONFIDENCE) -> Interval:
    """Pass rate of ``candidate`` minus that of ``base`` (each ``(passes, attempts)``, independent samples), with
    Newcombe's hybrid score interval: built from the two Wilson intervals, so it stays inside [-1, 1] and is not
    degenerate at 0 or all passes. One end at ``c`` two-sided is a one-sided bound at ``(1 + c) / 2``.

    >>> d = rate_difference((5, 20), (20, 20), confidence=0.90)
    >>> round(d.estimate, 2), d.high < 0
    (-0.75, True)
    """
    c, b = pass_rate(*candidate, confidence=confidence), pass_rate(*base, confidence=confidence)
    d = c.estimate - b.estimate
    low = d - float(np.hypot(c.estimate - c.low, b.high - b.estimate))
    high = d + float(np.hypot(c.high - c.estimate, b.estimate - b.low))
    return Interval(_exact(d), _exact(max(low, -1.0)), _exact(min(high, 1.0)), confidence, "newcombe hybrid score")


def crossed_contrast(arms: Sequence[Mapping[str, Sequence[float]]], weights: Sequence[float], *,
                     confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """The weighted sum of the arms' means over a task x seed table, tasks and seeds resampled as crossed factors.

    Each arm maps a task to its value under each procedure seed (the same seeds, in the same order,
    for every task and arm): an evolution or co-evolution run per seed makes the product every
    task then plays, so a seed's luck is shared by all its tasks, and an interval that resampled
    tasks alone would be too narrow. The pigeonhole bootstrap (Owen 2007, "The pigeonhole
    bootstrap") draws tasks and seeds with replacement independently and takes the mean of the
    table they pick; its percentile interval covers both sources of variation. One arm with
    weight 1 is a mean; two with weights -1, 1 a paired difference; four with 1, -1, -1, 1 a 2x2
    interaction.

    >>> a = {"t1": [1.0, 0.0], "t2": [1.0, 1.0]}
    >>> b = {"t1": [0.0, 0.0], "t2": [1.0, 0.0]}
    >>> round(crossed_contrast([b, a], [-1.0, 1.0]).estimate, 3)
    0.5
    """
    if len(arms) != len(weights) or not arms:
        raise IntervalError("a contrast needs one weight per arm")
    tasks = sorted(set.intersection(*(set(arm) for arm in arms)))
    if not tasks:
        raise IntervalError("the arms share no task")
    widths = {len(arm[t]) for arm in arms for t in tasks}
    if len(widths) != 1 or 0 in widths:  # a task short of a seed's value in some arm makes no table
        raise IntervalError("every arm needs one value per task and seed, the same seeds for every task")
    tables = [np.asarray([list(arm[t]) for t in tasks], dtype=float) for arm in arms]
    table = sum(float(w) * t for w, t in zip(weights, tables, strict=True))
    assert isinstance(table, np.ndarray)
    n_tasks, n_seeds = table.shape
    rng = np.random.default_rng(seed)
    rows = rng.multinomial(n_tasks, [1 / n_tasks] * n_tasks, size=RESAMPLES)  # how often each task is drawn
    cols = rng.multinomial(n_seeds, [1 / n_seeds] * n_seeds, size=RESAMPLES)
    means = np.einsum("bt,ts,bs->b", rows, table, cols) / (n_tasks * n_seeds)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return Interval(_exact(table.mean()), _exact(low), _exact(high), confidence,
                    f"crossed bootstrap tasks x {n_seeds} seeds")
