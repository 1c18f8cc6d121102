"""Interval scores: Wilson pass rates, the two-stage task bootstrap, the paired difference and the keep rule."""

from __future__ import annotations

import pytest

from hx.errors import IntervalError
from hx.intervals import (
    Verdict,
    keep_rule,
    paired_difference,
    pass_rate,
    task_mean,
    weighted_paired_difference,
    weighted_task_mean,
)


def test_a_pass_rate_has_its_wilson_interval_and_stays_inside_zero_and_one() -> None:
    r = pass_rate(8, 10)
    assert (r.estimate, round(r.low, 4), round(r.high, 4), r.method) == (0.8, 0.4902, 0.9433, "wilson")
    none, every = pass_rate(0, 10), pass_rate(10, 10)
    assert none.low == 0.0 and 0.0 < none.high < 0.35 and every.high == 1.0 and 0.65 < every.low < 1.0
    assert pass_rate(80, 100).high - pass_rate(80, 100).low < r.high - r.low  # more attempts, a narrower interval


@pytest.mark.parametrize(("passes", "attempts", "said"), [(1, 0, "at least one attempt"), (11, 10, "no pass rate"),
                                                           (-1, 10, "no pass rate")])
def test_a_pass_rate_of_no_attempts_is_an_error_naming_it(passes: int, attempts: int, said: str) -> None:
    with pytest.raises(IntervalError, match=said):
        pass_rate(passes, attempts)


def test_which_tasks_were_drawn_counts_not_only_which_attempts() -> None:
    # Same 40 attempts, same pass rate: every task passes half its attempts, or half the tasks always pass.
    even = {f"t{i}": [1.0, 0.0, 1.0, 0.0] for i in range(10)}
    split = {f"t{i}": [1.0] * 4 if i % 2 else [0.0] * 4 for i in range(10)}
    a, b = task_mean(even), task_mean(split)
    assert a.estimate == b.estimate == 0.5
    assert a.low <= a.estimate <= a.high and b.low <= b.estimate <= b.high
    # tasks that differ make the mean depend on which were drawn: a bootstrap of the attempts alone cannot see it
    assert (b.high - b.low) > 1.5 * (a.high - a.low)


def test_the_bootstrap_is_seeded() -> None:
    outcomes = {f"t{i}": [float((i * 7 + k) % 3 == 0) for k in range(3)] for i in range(12)}
    assert task_mean(outcomes, seed=3) == task_mean(outcomes, seed=3)
    assert paired_difference(outcomes, outcomes, seed=5) == paired_difference(outcomes, outcomes, seed=5)


def test_the_paired_difference_lets_each_tasks_difficulty_cancel() -> None:
    # Tasks of very different difficulty; the candidate adds about 0.1 on every one of them.
    base = {f"t{i}": [i / 20 + d for d in (0.0, 0.02, 0.04)] for i in range(16)}
    candidate = {t: [v + 0.1 for v in values] for t, values in base.items()}
    diff = paired_difference(base, candidate)
    assert diff.estimate == pytest.approx(0.1) and diff.low > 0.05
    assert keep_rule(diff) is Verdict.KEEP
    # compared unpaired, the two arms' intervals overlap: the task draw hides the gain
    assert task_mean(candidate).low < task_mean(base).high
    assert keep_rule(paired_difference(candidate, base)) is Verdict.DISCARD


def test_no_effect_is_inconclusive_and_a_task_only_one_arm_played_is_left_out() -> None:
    base = {f"t{i}": [1.0, 0.0, 1.0] if i % 2 else [0.0, 1.0, 0.0] for i in range(10)}
    candidate = {t: list(reversed(v)) for t, v in base.items()} | {"only-here": [1.0, 1.0, 1.0]}
    diff = paired_difference(base, candidate)
    assert diff.low < 0.0 < diff.high and keep_rule(diff) is Verdict.INCONCLUSIVE
    assert diff.estimate == pytest.approx(0.0)


def test_outcomes_an_interval_cannot_come_from_are_errors() -> None:
    with pytest.raises(IntervalError, match="no task in common"):
        paired_difference({"a": [1.0]}, {"b": [1.0]})
    with pytest.raises(IntervalError, match="no attempts for task 'a'"):
        task_mean({"a": [], "b": [1.0]})
    with pytest.raises(IntervalError, match="has no attempts"):
        task_mean({})


def test_the_weighted_mean_agrees_with_the_two_stage_bootstrap_and_weights_move_it() -> None:
    outcomes = {f"t{i}": [float((i * 7 + a) % 3 == 0) for a in range(5)] for i in range(12)}
    plain, fast = task_mean(outcomes), weighted_task_mean(outcomes)
    assert fast.estimate == pytest.approx(plain.estimate)
    assert fast.low == pytest.approx(plain.low, abs=0.03) and fast.high == pytest.approx(plain.high, abs=0.03)
    assert weighted_task_mean(outcomes, seed=3) == weighted_task_mean(outcomes, seed=3)
    heavy = weighted_task_mean({"a": [1.0, 1.0], "b": [0.0, 0.0]}, {"a": 3.0})
    assert heavy.estimate == 0.75 and heavy.method == "bootstrap tasks+attempts"
    one = weighted_task_mean({"only": [1.0, 0.0] * 50})
    assert one.low < 0.5 < one.high and one.high - one.low < 0.3  # one task: the attempts still vary


def test_the_weighted_paired_difference_keeps_a_clear_gain_and_refuses_bad_weights() -> None:
    base = {f"t{i}": [0.0, 0.0, 1.0] for i in range(10)}
    better = {f"t{i}": [1.0, 1.0, 1.0] for i in range(10)}
    diff = weighted_paired_difference(base, better, {"t0": 2.0})
    assert diff.estimate == pytest.approx(2 / 3) and keep_rule(diff) is Verdict.KEEP
    assert keep_rule(weighted_paired_difference(better, base)) is Verdict.DISCARD
    with pytest.raises(IntervalError, match="weights"):
        weighted_task_mean({"a": [1.0]}, {"a": 0.0})
    with pytest.raises(IntervalError, match="no task in common"):
        weighted_paired_difference({"a": [1.0]}, {"b": [1.0]})
