"""Scoring an eval: each attempt's composite, each task's scores and the suite's, every one with its interval.

Per attempt ``c = success_weight * passed + criteria_weight * (criteria passed / criteria checked)``
(0.7 and 0.3 unless the suite says otherwise; an attempt of a task without criteria scores
``c = passed``). A task's composite is the mean of its attempts'; the suite's is the
weight-weighted mean of its tasks'. Intervals come from ``hx.intervals``: Wilson for the success
and criteria pass rates, the two-stage bootstrap (tasks, then attempts within each) for the
composite. Two evals are compared by the paired bootstrap difference of their composites and
the keep rule on it.

>>> w = Weights()
>>> AttemptScore(passed=True, checked=2, criteria_passed=1).composite(w)
0.85
>>> AttemptScore(passed=True).composite(w)
1.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hx.intervals import Interval, keep_rule, paired_difference, pass_rate, task_mean
from schemas.evaluation import Bounds, KeepVerdict, TaskScored

NO_CRITERIA = Bounds(estimate=0.0, low=0.0, high=0.0, method="none")
"""The criteria pass rate of a task (or suite) none of whose attempts had a criterion checked."""


@dataclass(frozen=True)
class Weights:
    """How much an attempt's success and its criteria pass rate count in its composite."""

    success: float = 0.7
    criteria: float = 0.3


@dataclass(frozen=True)
class AttemptScore:
    """One judged attempt: its verdict and how many of its criteria were checked and passed."""

    passed: bool
    checked: int = 0
    criteria_passed: int = 0

    def composite(self, weights: Weights) -> float:
        """``success * passed + criteria * (passed / checked)``; without criteria, ``passed``."""
        if not self.checked:
            return float(self.passed)
        return round(weights.success * self.passed + weights.criteria * self.criteria_passed / self.checked, 12)


@dataclass(frozen=True)
class TaskOutcomes:
    """A suite task's judged attempts, in attempt order."""

    suite_task: str
    task: str
    """The task id it ran as."""
    weight: float
    attempts: tuple[AttemptScore, ...]


def bounds(interval: Interval) -> Bounds:
    """The event payload of an interval."""
    return Bounds(estimate=interval.estimate, low=interval.low, high=interval.high, confidence=interval.confidence,
                  method=interval.method)


def interval(b: Bounds) -> Interval:
    """The interval an event's ``Bounds`` carries."""
    return Interval(b.estimate, b.low, b.high, b.confidence, b.method)


def _criteria(checked: int, passed: int) -> Bounds:
    return bounds(pass_rate(passed, checked)) if checked else NO_CRITERIA


def task_scored(run_id: str, outcomes: TaskOutcomes, weights: Weights, *, seed: int = 0) -> TaskScored:
    """The ``TaskScored`` of one suite task (it needs at least one attempt)."""
    attempts = outcomes.attempts
    composites = tuple(a.composite(weights) for a in attempts)
    checked = sum(a.checked for a in attempts)
    passed = sum(a.criteria_passed for a in attempts)
    return TaskScored(
        run_id=run_id, suite_task=outcomes.suite_task, task=outcomes.task, weight=outcomes.weight,
        attempts=len(attempts), passes=sum(a.passed for a in attempts), criteria_checked=checked,
        criteria_passed=passed, success=bounds(pass_rate(sum(a.passed for a in attempts), len(attempts))),
        criteria=_criteria(checked, passed),
        composite=bounds(task_mean({outcomes.suite_task: composites}, seed=seed)), composites=composites)


@dataclass(frozen=True)
class SuiteScores:
    """The suite's pooled success and criteria pass rates and its weighted composite."""

    tasks: int
    attempts: int
    success: Bounds
    criteria: Bounds
    composite: Bounds


def suite_scores(tasks: Sequence[TaskScored], *, seed: int = 0) -> SuiteScores:
    """The suite's scores from its tasks' (each task's ``composites`` resampled, weighted by its weight)."""
    attempts = sum(t.attempts for t in tasks)
    checked = sum(t.criteria_checked for t in tasks)
    composite = task_mean({t.suite_task: t.composites for t in tasks},
                          weights={t.suite_task: t.weight for t in tasks}, seed=seed)
    return SuiteScores(len(tasks), attempts, bounds(pass_rate(sum(t.passes for t in tasks), attempts)),
                       _criteria(checked, sum(t.criteria_passed for t in tasks)), bounds(composite))


@dataclass(frozen=True)
class Comparison:
    """This eval against a base eval: the paired difference of composites, the keep rule's verdict, the flips."""

    difference: Bounds
    verdict: KeepVerdict
    flipped: tuple[str, ...]
    common: int
    """Suite tasks both evals scored (the only ones compared)."""


def solved(task: TaskScored) -> bool:
    """A task counts as solved when more than half its attempts passed (what a flip changes)."""
    return task.passes * 2 > task.attempts


def compare(base: Mapping[str, TaskScored], this: Mapping[str, TaskScored], *, seed: int = 0) -> Comparison:
    """This eval minus ``base`` over the suite tasks both scored; ``IntervalError`` when they share none."""
    common = sorted(set(base) & set(this))
    diff = paired_difference({t: base[t].composites for t in common}, {t: this[t].composites for t in common},
                             weights={t: this[t].weight for t in common}, seed=seed)
    flipped = tuple(f"{t}: {base[t].passes}/{base[t].attempts} -> {this[t].passes}/{this[t].attempts}"
                    for t in common if solved(base[t]) != solved(this[t]))
    return Comparison(bounds(diff), keep_rule(diff).value, flipped, len(common))
