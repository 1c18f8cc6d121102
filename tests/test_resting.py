"""Barren tasks rest (``hx.aegis.resting``): which tasks sit out a round, read from the digests alone."""

from __future__ import annotations

from hx.aegis.resting import resting
from schemas.landscape import TaskDigest

TASKS = ("g:a", "g:b", "g:c")


def digest(task: str, passes: int) -> TaskDigest:
    """A task's digest with 2 attempts."""
    return TaskDigest(task=task, cluster="g", attempts=2, passes=passes)


def play(outcomes: dict[str, list[int]], rounds: int, total: int) -> dict[int, frozenset[str]]:
    """Run the rule for ``total`` rounds; a task plays its next outcome whenever it does not rest."""
    digests: dict[int, list[TaskDigest]] = {}
    rested = {}
    left = {t: list(o) for t, o in outcomes.items()}
    for t in range(total):
        rested[t] = resting(digests, TASKS, t, rounds)
        digests[t] = [digest(task, left[task].pop(0)) for task in TASKS if task not in rested[t]]
    return rested


def test_a_task_failing_every_attempt_of_r_rounds_sits_out_r_rounds_then_plays_once_more() -> None:
    rested = play({"g:a": [0] * 20, "g:b": [1] * 20, "g:c": [0, 0, 0, 1] + [0] * 16}, rounds=2, total=10)
    assert [t for t in range(10) if "g:a" in rested[t]] == [2, 3, 5, 6, 8, 9]  # plays 0, 1, then 1 round in 3
    assert all("g:b" not in r for r in rested.values())  # a task that passes is never barren
    # g:c: fails rounds 0 and 1, rests 2 and 3, plays round 4 (its 3rd outcome, 0) and rests again; round 7 it
    # plays its 4th outcome, a pass, which makes it play every round after
    assert [t for t in range(10) if "g:c" in rested[t]] == [2, 3, 5, 6]


def test_one_passing_attempt_among_the_last_rounds_keeps_a_task_playing() -> None:
    digests = {0: [digest("g:a", 0)], 1: [digest("g:a", 1)], 2: [digest("g:a", 0)]}
    assert resting(digests, TASKS, 3, 2) == frozenset()
    assert resting(digests, TASKS, 3, 1) == {"g:a"}


def test_nothing_rests_when_every_task_would_or_when_the_rule_is_off() -> None:
    digests = {r: [digest(t, 0) for t in TASKS] for r in range(3)}
    assert resting(digests, TASKS, 3, 2) == frozenset()  # a round with no task would teach nothing either
    assert resting(digests, (*TASKS[:2], "g:new"), 3, 2) == {"g:a", "g:b"}  # a task never played is not barren
    assert resting(digests, TASKS, 3, 0) == frozenset()


def test_rounds_at_or_after_the_one_asked_about_do_not_count() -> None:
    digests = {0: [digest("g:a", 0)], 1: [digest("g:a", 0)], 2: [digest("g:a", 1)]}
    assert resting(digests, TASKS, 2, 2) == {"g:a"}  # round 2's pass is not known before round 2
