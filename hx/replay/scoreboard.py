"""A run's report read off its ledger: a row per round, held-out before and after, the variants.

``report`` reads the ledger's one fold (``projections.ledger.RunLedger``): it is what ``hx evolve``
prints at the end, what ``hx state`` shows as of a round, and what ``hx report`` draws, so the
three always agree with the ledger and with each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hx.environments.registry import TaskId
from projections.ledger import RunLedger
from schemas.ledger import GameScore, HeldoutScored


@dataclass
class RoundRow:
    """One round as the results table shows it."""

    round: int
    outcome: str
    variants: int
    shipped: tuple[str, ...]
    pass_at_k: float | None
    rollouts: int
    seconds: float | None


@dataclass
class EvolutionReport:
    """What a run did, from its ledger: a row per round, held-out before and after, the variants."""

    run_id: str
    status: str
    rounds: list[RoundRow] = field(default_factory=list)
    heldout_before: HeldoutScored | None = None
    heldout_after: HeldoutScored | None = None
    variants: dict[str, str] = field(default_factory=dict)
    """Live variant -> its harness digest."""
    routing: dict[str, str] = field(default_factory=dict)
    """Task cluster (every one the run routed or ran) -> the variant it runs under (``RunLedger.route``)."""
    unserved: str = ""
    """The variant a cluster not run yet would run under (``RunLedger.unserved``: the best overall success)."""
    learner: list[Any] = field(default_factory=list)
    """Co-evolution: the learner's records (``PolicyUpdated``, ``UpdateSkipped``, ``PolicyGated``), in order."""
    policy: str = ""
    """Co-evolution: the policy version the run ended with."""
    heldout_split: str = "test"
    """Where the held-out tasks came from (``train``: a validation split)."""

    def games(self) -> list[tuple[str, GameScore | None, GameScore | None]]:
        """Per game: held-out figures before and after."""
        before = {g.game: g for g in (self.heldout_before.games if self.heldout_before else ())}
        after = {g.game: g for g in (self.heldout_after.games if self.heldout_after else ())}
        return [(g, before.get(g), after.get(g)) for g in sorted({*before, *after})]


def report(ledger: RunLedger, seconds: dict[int, float]) -> EvolutionReport:
    """A run's report from its ledger's fold (``seconds``: each round's wall time, when this process ran it)."""
    assert ledger.opened is not None
    rows = [RoundRow(round=n, outcome=d.outcome, variants=len({x.variant for x in ledger.digests.get(n, ())}) or 1,
                     shipped=d.shipped, pass_at_k=d.metrics.pass_at_k, rollouts=d.metrics.rollouts,
                     seconds=seconds.get(n)) for n, d in ledger.decisions.items()]
    held = ledger.heldout
    return EvolutionReport(
        run_id=ledger.run_id, status=ledger.finished.status if ledger.finished else "unfinished", rounds=rows,
        heldout_before=next((h for h in held if h.round == -1), None),
        heldout_after=held[-1] if len(held) > 1 else None,
        variants={n: v.digest for n, v in ledger.active().items()},
        routing={c: ledger.route(c) for c in ledger.clusters()}, unserved=ledger.unserved(),
        heldout_split=", ".join(sorted({TaskId.parse(t).split for t in ledger.opened.settings.get("heldout", ())}))
        or "test")
