"""Rollouts: every live variant plays its share of the adaptation tasks (those not resting) on the trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hx.aegis.stage import Played, RoundContext
from hx.aegis.state import RunState
from hx.aegis.variants import route
from hx.environments.splits import round_roles

Resting = Callable[[RunState, int], frozenset[str]]
"""The adaptation tasks that sit out round t (co-evolution's barren tasks)."""


@dataclass
class Rollouts:
    """The round's main rollouts, one trace round per variant; ``resting`` says which tasks sit out."""

    resting: Resting | None = None
    name: str = "rollouts"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> Played | None:
        """The trace rounds the round's digest cites: once digested, the rollouts are not redone."""
        digested = ctx.records.digested
        if digested is None:
            return None
        trials = ctx.run.trials
        roles = await round_roles(trials.log, ctx.run.run_id)
        # the gate replays each variant's main rollouts: a resumed process learns where they are from the log
        trials.main_rounds = {roles[r].variant: r for r in digested.trace_rounds if r in roles}
        return Played(digested.trace_rounds, {}, frozenset(digested.rested))

    async def run(self, ctx: RoundContext) -> Played:
        """Play each live variant's share of the tasks."""
        run = ctx.run
        state = run.state()
        rested = self.resting(state, ctx.round) if self.resting is not None else frozenset()
        variants: dict[str, str] = {}
        trace_rounds = []
        playing = [task for task in run.trials.splits.adaptation if task not in rested]
        for variant, tasks in route(state, playing).items():
            trace_rounds.append(await run.trials.main(variant, state.variants[variant].harness, tasks))
            variants.update(dict.fromkeys(tasks, variant))
        return Played(tuple(trace_rounds), variants, rested)

    def take(self, ctx: RoundContext, output: Played) -> None:
        """The rollouts, for ``Digest``."""
        ctx.played = output

    def show(self, output: Played) -> str:
        """How many trace rounds; how many tasks rested."""
        rested = f", {len(output.rested)} task(s) resting" if output.rested else ""
        return f"{len(output.trace_rounds)} trace round(s){rested}"
