"""Round metrics: adaptation pass@k, how good the last round's ship predictions were, regressions, lever mix.

Computed from the ledger alone (``RunState``) when a round is decided, and written into
its ``RoundDecided``: the hit rate (``RoundMetrics.hit_rate``) is the share of the flips the
previous round's ships predicted (on tasks this round ran) that happened; attribution is the share
of those realised flips on which the shipped processor's group acted.
"""

from __future__ import annotations

from collections import Counter

from hx.aegis.state import RunState
from schemas.ledger import RoundMetrics, RoundTokens


def metrics(state: RunState, t: int, rollouts: int, tokens: RoundTokens) -> RoundMetrics:
    """The round's figures: adaptation pass@k, last round's ship predictions and attribution, regressions, mix,
    and the attempts and tokens it spent."""
    digests = state.digests.get(t, ())
    by_task = {d.task: d for d in digests}
    predicted = realised = attributed = 0
    for ship in state.ships:
        if ship.round != t - 1:
            continue
        for task in ship.manifest.predicted_flips:
            d = by_task.get(task)
            if d is None:
                continue
            predicted += 1
            if d.solved:
                realised += 1
                attributed += ship.manifest.attribution in d.implicated
    before = {d.task: d.solved for d in state.digests.get(t - 1, ())}
    solved = sum(d.solved for d in digests)
    return RoundMetrics(tasks=len(digests), passes=solved,
                        pass_at_k=round(solved / len(digests), 4) if digests else None,
                        predicted=predicted, realised=realised,
                        attribution=round(attributed / realised, 4) if realised else None,
                        regressions=sum(1 for d in digests if before.get(d.task) and not d.solved),
                        lever_mix=dict(sorted(Counter(b for s in state.ships for b in s.buckets).items())),
                        rollouts=rollouts, tokens=tokens)
