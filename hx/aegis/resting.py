"""Barren tasks rest: rollouts go where the learner can learn from them.

A GRPO group whose attempts all scored the same carries no gradient, and a task whose
attempts all failed carries none at the step level either (every return is zero). Its
rollouts spend the budget and teach nothing. With ``rounds = R``, a task whose last R
played rounds failed every attempt sits out the next R rounds, then plays again, so a
policy that has improved meanwhile gets its chance at it (the idea of dynamic sampling in
DAPO, Yu et al. 2025, and of prioritised level replay, Jiang et al. 2021, in its
simplest form). A round in which every task would rest plays them all.

The rule reads only the ledger's digests (which tasks played in which round, and whether
any attempt passed), so a resumed run rests the same tasks as the run that stopped. It
knows nothing of a game.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schemas.landscape import TaskDigest


def resting(digests: Mapping[int, Sequence[TaskDigest]], tasks: Sequence[str], before: int,
            rounds: int) -> frozenset[str]:
    """The tasks that sit out round ``before``: their last ``rounds`` played rounds failed every attempt, and
    they have sat out fewer than ``rounds`` rounds since."""
    if rounds <= 0:
        return frozenset()
    played = {r: {d.task: d.passes for d in ds} for r, ds in digests.items() if r < before}
    out = set()
    for task in tasks:
        idle = 0  # rounds sat out since it last played
        failed = 0  # played rounds in a row, latest first, with no attempt passing
        for r in range(before - 1, -1, -1):
            passes = played.get(r, {}).get(task)
            if passes is None:
                if failed == 0:
                    idle += 1
                continue
            if passes > 0:
                break
            failed += 1
            if failed == rounds:
                break
        if failed >= rounds and idle < rounds:
            out.add(task)
    return frozenset() if len(out) == len(tasks) else frozenset(out)
