"""Held-out evaluation: a rollout's harness on the frozen held-out split, aggregate scores only.

The held-out split is never adapted on, only evaluated (``hx.environments.splits``). Its rounds
run like any other, every attempt on the log tagged ``heldout``, but the caller gets back
pass@k and means per game and overall, never which task passed, so nothing that edits the
harness can learn from individual held-out tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hx.environments.errors import SplitViolation
from hx.environments.results import Summary
from hx.environments.rollout import Rollout
from hx.environments.splits import Splits
from hx.runtime.loop import AttemptResult


@dataclass(frozen=True)
class HeldoutScore:
    """What a held-out evaluation hands back: aggregates only, no per-task verdict."""

    run_id: str
    round: int
    heldout_digest: str
    overall: Summary
    games: tuple[Summary, ...]


async def evaluate_heldout(rollout: Rollout, run_id: str, round: int, splits: Splits, *,
                           progress: Callable[[int, int], None] | None = None) -> HeldoutScore:
    """Evaluate the frozen held-out split as a ``heldout`` round; return only aggregate scores.

    Every attempt lands on the log (tagged held-out, so ``adaptation_history`` never reads
    it); the caller gets pass@k and means per game, never which task passed.
    """
    if not splits.heldout:
        raise SplitViolation("the held-out split is empty: nothing to evaluate")
    total = len(splits.heldout) * rollout.settings.attempts
    count = 0

    def tick(_: AttemptResult) -> None:
        nonlocal count
        count += 1
        if progress is not None:
            progress(count, total)

    checked = Rollout(list(rollout.benchmarks.values()), rollout.models, rollout.harness, log=rollout.log,
                      settings=rollout.settings, writer=rollout.writer, splits=splits,
                      harness_source=rollout.harness_source, resources=rollout.resources)
    outcome = await checked.run_round(run_id, round, splits.heldout, role="heldout", progress=tick)
    return HeldoutScore(run_id, round, splits.heldout_digest, outcome.report.overall, outcome.report.games)
