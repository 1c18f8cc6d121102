"""Plan: the round's adaptation landscape (``hx.aegis.planner``), on the ledger; an empty one ends the round."""

from __future__ import annotations

from dataclasses import dataclass

from hx.aegis.errors import PipelineError
from hx.aegis.planner import plan
from hx.aegis.stage import RoundContext
from schemas.ledger import LandscapePlanned


@dataclass
class Plan:
    """Maps regressions, failure groups, tried and untried buckets, levers and bans from the digests."""

    name: str = "plan"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> LandscapePlanned | None:
        """The round's ``LandscapePlanned``."""
        return ctx.records.landscape

    async def run(self, ctx: RoundContext) -> LandscapePlanned:
        """Plan from the round's digests and append the landscape."""
        if ctx.digested is None:
            raise PipelineError("the plan stage needs the round's digests: put Digest before Plan")
        run = ctx.run
        landscape = LandscapePlanned(run_id=run.run_id, round=ctx.round,
                                     landscape=plan(run.state(), ctx.round, ctx.digested.digests))
        await run.append(landscape)
        return landscape

    def take(self, ctx: RoundContext, output: LandscapePlanned) -> None:
        """The landscape, for the evolver and the critic; an empty one ends the round."""
        ctx.landscape = output
        if output.landscape.empty:
            ctx.end("empty_landscape", "no regression and no categorised failure")

    def show(self, output: LandscapePlanned) -> str:
        """Regressions and failure groups."""
        land = output.landscape
        return f"{len(land.regressions)} regression(s), {len(land.failures)} failure group(s)"
