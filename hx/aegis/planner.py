"""The Planner: the round's adaptation landscape, regressions first.

From the round's digests and the run's ledger it maps: regressions (k-aware: tasks whose
pass@k state went from solved to unsolved against the previous round, with the ships to
their variant in between as suspects), the failures grouped by category (persistent and
new), which edit buckets and behavioural dimensions were tried and which never were, the
record of every lever, and the last critic's strategy concern with the levers it bans for
this round. A landscape with no regression and no failure is empty: the round ends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from hx.aegis import levers
from hx.aegis.state import RunState
from schemas.edits import BUCKETS
from schemas.landscape import FailureGroup, Landscape, TaskDigest

DIMENSIONS = tuple(f"D{i}" for i in range(1, 10))


def failure_groups(digests: Sequence[TaskDigest]) -> tuple[FailureGroup, ...]:
    """Failing tasks grouped by category (largest group first), with the processors implicated."""
    tasks: dict[str, list[str]] = defaultdict(list)
    implicated: dict[str, dict[str, None]] = defaultdict(dict)
    for d in digests:
        if not d.solved and d.category:
            tasks[d.category].append(d.task)
            implicated[d.category].update(dict.fromkeys(d.implicated))
    return tuple(FailureGroup(category=c, tasks=tuple(ts), implicated=tuple(implicated[c]))
                 for c, ts in sorted(tasks.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def plan(state: RunState, round: int, digests: Sequence[TaskDigest]) -> Landscape:
    """The landscape of ``round`` from its digests and the run's ledger."""
    tried_buckets = {b for c in state.candidates.values() for b in c.proposal.buckets}
    tried_dims = {d for c in state.candidates.values() for d in c.proposal.dimensions}
    banned = state.ban_in_force(round)
    known = levers.catalog()
    names = [*known, *sorted({name for c in state.candidates.values() for name in c.levers if name not in known})]
    return Landscape(
        regressions=state.regressions(round, digests), failures=failure_groups(digests),
        tried_buckets=tuple(b for b in BUCKETS if b in tried_buckets),
        untried_buckets=tuple(b for b in BUCKETS if b not in tried_buckets),
        tried_dimensions=tuple(d for d in DIMENSIONS if d in tried_dims),
        untried_dimensions=tuple(d for d in DIMENSIONS if d not in tried_dims),
        levers=levers.records(state, names, banned), concern=state.concern if state.banned_round == round - 1 else "",
        banned=banned)
