"""``offline+induced``: the catalog evolver and the induced one as peers, both proposing in one round.

Each is asked for up to ``k`` candidates; their proposals are taken in turn (the catalog's
first, then the induced one's, and so on) until ``k``, so when both have something to try
both are tried, and when one has nothing the other fills the round. Their notes are joined.
"""

from __future__ import annotations

from itertools import zip_longest

from hx.aegis.evolvers.base import Context, Evolver, Proposal
from hx.aegis.evolvers.induced import InducedEvolver
from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.meta import MetaAgent
from hx.runtime.code import CodeStore
from projections.ledger_records import lever_of


class CatalogAndInduced(Evolver):
    """The catalog evolver and the induced evolver, taking turns."""

    name = "offline+induced"

    def __init__(self) -> None:
        self.catalog, self.induced = OfflineEvolver(), InducedEvolver()
        self.notes: list[str] = []

    @classmethod
    def build(cls, *, meta: MetaAgent | None, store: CodeStore | None) -> Evolver:
        """Both parts need neither a meta-model nor a code store."""
        return cls()

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """Up to ``k`` candidates, the parts' proposals interleaved (each edit once)."""
        lists = [await self.catalog.propose(context, k), await self.induced.propose(context, k)]
        out: list[Proposal] = []
        seen: set[tuple[str, tuple[str, ...]]] = set()
        for turn in zip_longest(*lists):
            for proposal in turn:
                if proposal is None or len(out) >= k:
                    continue
                key = (proposal.variant, tuple(lever_of(op) for op in proposal.operations))
                if key not in seen:
                    seen.add(key)
                    out.append(proposal)
        # The induced evolver counted the rules left after all k of its own; the round tries only those taken here.
        self.notes = [*getattr(self.catalog, "notes", []), *self.induced.counted(out)]
        return out
