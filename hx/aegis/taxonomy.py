"""The failure taxonomy: a failed attempt's category, computed from trace features, first match wins.

| category | the attempt ... |
| --- | --- |
| ``infrastructure`` | ended in an infrastructure failure (status ``infra_failure``) |
| ``interrupted`` | was ended by a processor (an ``interrupted`` trigger: loop detector, budget, ...) |
| ``premature_answer`` | stopped by itself (the model called no tool) before the task was done |
| ``env_failure`` | was lost in the environment (the episode ended in failure) |
| ``loop`` | ended repeating itself: the last ``LOOP_TAIL`` steps hold a cycle of period <= 3, >= 3 times |
| ``invalid_action`` | spent at least ``INVALID_SHARE`` of its steps on actions refused or not offered |
| ``stagnation`` | went ``STAGNANT_SHARE`` of its steps (at least ``STAGNANT_MIN``) without a new observation |
| ``no_progress`` | ran out of steps without the score ever rising |
| ``partial_progress`` | ran out of steps after the score rose |

The thresholds are properties of trajectories in general, fixed here and documented, never
tuned to a benchmark. ``features`` reports the numbers the category was read from.
"""

from __future__ import annotations

from hx.aegis.evidence import AttemptFacts
from schemas.landscape import FailureCategory

LOOP_TAIL = 12
LOOP_PERIODS = (1, 2, 3)
LOOP_REPEATS = 3
INVALID_SHARE = 0.25
STAGNANT_SHARE = 0.4
STAGNANT_MIN = 10


def features(fact: AttemptFacts) -> dict[str, float]:
    """The trace features of one attempt (shares are of its steps)."""
    steps = max(1, len(fact.actions))
    scores = fact.scores or [0.0]
    return {
        "steps": float(fact.steps),
        "refused_share": fact.refused / steps,
        "invalid_share": fact.invalid / steps,
        "repeat_share": 1.0 - len(set(zip(fact.actions, fact.observations[1:], strict=False))) / steps
        if fact.actions else 0.0,
        "longest_stale": float(_longest_stale(fact.observations)),
        "progress": max(scores) - scores[0],
        "loop": float(_looping(fact)),
    }


def _longest_stale(observations: list[str]) -> int:
    """The longest run of steps whose observation was seen before in the attempt."""
    seen: set[str] = set()
    run = longest = 0
    for i, obs in enumerate(observations):
        if obs in seen and i:
            run += 1
            longest = max(longest, run)
        else:
            run = 0
        seen.add(obs)
    return longest


def _looping(fact: AttemptFacts) -> bool:
    """True when the attempt's last steps repeat a short cycle of (action, observation)."""
    sig = list(zip(fact.actions, fact.observations[1:], strict=False))[-LOOP_TAIL:]
    for period in LOOP_PERIODS:
        need = period * LOOP_REPEATS
        if len(sig) >= need and all(sig[-1 - i] == sig[-1 - i - period] for i in range(need - period)):
            return True
    return False


def categorise(fact: AttemptFacts) -> FailureCategory | None:
    """The category of a failed attempt (None for a passed one)."""
    if fact.passed:
        return None
    if fact.status == "infra_failure":
        return "infrastructure"
    if fact.interrupts or fact.status == "interrupted":
        return "interrupted"
    if fact.status == "completed" and not fact.env_done:
        return "premature_answer"
    if fact.env_failure:
        return "env_failure"
    feats = features(fact)
    steps = max(1.0, float(len(fact.actions)))
    if feats["loop"]:
        return "loop"
    if feats["refused_share"] + feats["invalid_share"] >= INVALID_SHARE:
        return "invalid_action"
    if feats["longest_stale"] >= max(STAGNANT_MIN, STAGNANT_SHARE * steps):
        return "stagnation"
    return "partial_progress" if feats["progress"] > 0 else "no_progress"
