"""Approved ships: candidates a human approved since their round ship (or fork) before the round's rollouts."""

from __future__ import annotations

from dataclasses import dataclass

from hx.aegis.shipping import ship_approved
from hx.aegis.stage import RoundContext


@dataclass
class ShipApproved:
    """Ships what was approved after its round, if its variant still has the harness it was judged on."""

    name: str = ""
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> None:
        """Never recorded as a whole: each approval ships once (``RunState.pending`` forgets shipped ones)."""
        return None

    async def run(self, ctx: RoundContext) -> None:
        """Ship (or fork) the approved candidates."""
        run = ctx.run
        # trials.digests are the previous round's here: a fork retiring a variant weighs what it last did
        await ship_approved(run, ctx.round, max_variants=run.settings.max_variants, digests=run.trials.digests)

    def take(self, ctx: RoundContext, output: None) -> None:
        """Nothing for later stages: the ships are on the ledger, so in the state they fold."""

    def show(self, output: None) -> str:
        """Nothing to show."""
        return ""
