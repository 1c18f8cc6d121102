"""Interval scores: Wilson pass rates, the two-stage task bootstrap, the paired difference and the keep rule."""

from __future__ import annotations

import pytest

from hx.errors import IntervalError
from hx.intervals import (
    Interval,
    Verdict,
    contrast,
    keep_rule,
    ordinal_median,
    paired_difference,
    pass_rate,
    rate_difference,
    standardised_difference,
    task_mean,
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


def test_weights_count_a_task_as_often_as_its_weight() -> None:
    outcomes = {"heavy": [1.0, 1.0], "light": [0.0, 0.0]}
    assert task_mean(outcomes).estimate == 0.5
    weighted = task_mean(outcomes, weights={"heavy": 3.0, "light": 1.0})
    assert weighted.estimate == 0.75 and weighted.low <= 0.75 <= weighted.high
    # the same as playing the heavy task three times over
    assert weighted.estimate == task_mean({"h1": [1.0, 1.0], "h2": [1.0, 1.0], "h3": [1.0, 1.0],
                                           "light": [0.0, 0.0]}).estimate
    with pytest.raises(IntervalError, match="no weight for task 'light'"):
        task_mean(outcomes, weights={"heavy": 1.0})
    with pytest.raises(IntervalError, match="positive"):
        task_mean(outcomes, weights={"heavy": 1.0, "light": 0.0})


def test_the_inner_resample_draws_each_tasks_own_attempts() -> None:
    # One task: only the attempts can vary. All-pass and all-fail tasks have no spread at all.
    assert task_mean({"a": [1.0, 1.0, 1.0]}).low == 1.0
    mixed = task_mean({"a": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]})
    assert mixed.low < 0.5 < mixed.high and mixed.low >= 0.0 and mixed.high <= 1.0
    # many tasks of unequal attempt counts: the interval still holds the estimate, values from the arrays only
    many = {f"t{i}": [float(k % (i % 4 + 2) == 0) for k in range(1 + i % 7)] for i in range(300)}
    r = task_mean(many, seed=2)
    assert r.low < r.estimate < r.high and r.low >= 0.0 and r.high <= 1.0


def test_ordinal_grades_get_a_median_and_an_order_statistic_interval() -> None:
    grades = [3, 4, 4, 5, 2, 4, 3, 4, 5, 4, 3, 4]
    r = ordinal_median(grades)
    assert r.estimate == 4.0 and r.method.startswith("order statistics")
    assert (r.low, r.high) == (3.0, 4.0)  # the 3rd and 10th of 12 sorted grades: coverage >= 95 %
    assert ordinal_median([2, 5]).low == 2.0 and ordinal_median([2, 5]).high == 5.0  # too few: the whole range
    with pytest.raises(IntervalError, match="at least one score"):
        ordinal_median([])


def test_the_standardised_difference_scales_by_the_pooled_spread() -> None:
    base = {"a": [0.0, 0.0, 1.0, 0.0], "b": [0.0, 1.0, 0.0, 0.0], "c": [0.0, 0.0, 0.0, 1.0]}
    candidate = {"a": [1.0, 1.0, 1.0, 0.0], "b": [1.0, 1.0, 0.0, 1.0], "c": [1.0, 1.0, 1.0, 1.0]}
    size = standardised_difference(base, candidate, seed=3)
    p = 13 / 24  # 3 + 10 ones among the 24 outcomes: the pooled sd is sqrt(p (1 - p))
    assert size.estimate == pytest.approx((10 / 12 - 3 / 12) / (p * (1 - p)) ** 0.5)
    assert size.low <= size.estimate <= size.high
    assert size == standardised_difference(base, candidate, seed=3)
    same = {"a": [1.0, 1.0], "b": [1.0, 1.0]}
    assert standardised_difference(same, same).estimate == 0.0  # nothing varies: no effect, not a division by 0


def test_a_two_by_two_interaction_is_a_contrast_of_four_arms() -> None:
    a0b0 = {"t1": [0.0, 0.0], "t2": [0.0, 0.0]}
    a0b1 = {"t1": [1.0, 0.0], "t2": [0.0, 1.0]}
    a1b0 = {"t1": [0.0, 0.0], "t2": [0.0, 0.0]}
    a1b1 = {"t1": [1.0, 1.0], "t2": [1.0, 1.0]}
    interaction = contrast([a0b0, a0b1, a1b0, a1b1], [1.0, -1.0, -1.0, 1.0])
    assert interaction.estimate == pytest.approx((1.0 - 0.0) - (0.5 - 0.0))
    assert interaction.low <= interaction.estimate <= interaction.high
    difference = paired_difference(a0b0, a1b1, seed=0)
    assert contrast([a0b0, a1b1], [-1.0, 1.0], seed=0).estimate == difference.estimate
    with pytest.raises(IntervalError, match="one weight per arm"):
        contrast([a0b0], [1.0, -1.0])


def test_the_weighted_paired_difference_keeps_a_clear_gain() -> None:
    base = {f"t{i}": [0.0, 0.0, 1.0] for i in range(10)}
    better = {f"t{i}": [1.0, 1.0, 1.0] for i in range(10)}
    weights = {t: 2.0 if t == "t0" else 1.0 for t in base}
    diff = paired_difference(base, better, weights=weights)
    assert diff.estimate == pytest.approx(2 / 3) and keep_rule(diff) is Verdict.KEEP
    assert keep_rule(paired_difference(better, base, weights=weights)) is Verdict.DISCARD
    one = task_mean({"only": [1.0, 0.0] * 50})
    assert one.low < 0.5 < one.high and one.high - one.low < 0.3  # one task: the attempts still vary


def test_an_interval_end_that_is_zero_reads_zero_not_rounding_noise() -> None:
    # Outcomes as an experiment logged them: 10 tasks x 20 replications, the arms equal on 7 tasks. The
    # bootstrap's lower end is a sum that is 0 in exact arithmetic; unrounded it came out -6.9e-20 here,
    # and as +5e-18 in a real experiment, where it put the interval "above 0" and the keep rule said KEEP.
    base = {"t0": "00001000000000000000", "t1": "00100101100100000010", "t2": "00100001001000010001",
            "t3": "00000000000100000010", "t4": "01000001010010001000", "t5": "00000001000001100010",
            "t6": "01001110000000000000", "t7": "00100001110001000000", "t8": "00000100010010100000",
            "t9": "00000100000100000000"}
    changed = {"t0": "11110100000000000100", "t3": "00000100111010101010", "t6": "00100110110010001011",
               "t9": "10110100111001010001"}
    b = {t: [float(c) for c in v] for t, v in base.items()}
    c = {t: [float(ch) for ch in changed.get(t, v)] for t, v in base.items()}
    diff = paired_difference(b, c, seed=7)
    assert diff.low == 0.0 and diff.high > 0.0
    assert keep_rule(diff) is Verdict.INCONCLUSIVE
    assert keep_rule(Interval(0.1, 0.0, 0.2, 0.95, "bootstrap")) is Verdict.INCONCLUSIVE


@pytest.mark.parametrize(("candidate", "base", "low", "high"), [
    ((56, 70), (48, 80), 0.0524, 0.3339), ((9, 10), (3, 10), 0.1705, 0.8090), ((10, 10), (0, 10), 0.6075, 1.0)])
def test_a_difference_of_two_pass_rates_has_newcombes_hybrid_score_interval(
        candidate: tuple[int, int], base: tuple[int, int], low: float, high: float) -> None:
    # Newcombe (1998), Statistics in Medicine 17:873-890, table II, method 10
    d = rate_difference(candidate, base)
    assert (round(d.low, 4), round(d.high, 4)) == (low, high)
    assert d.estimate == pytest.approx(candidate[0] / candidate[1] - base[0] / base[1])
