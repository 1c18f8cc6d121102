"""Decide: the round's outcome, with its metrics and the run's idle streak, on the ledger (``RoundDecided``)."""

from __future__ import annotations

from dataclasses import dataclass

from hx.aegis.errors import PipelineError
from hx.aegis.metrics import metrics
from hx.aegis.stage import RoundContext
from hx.aegis.tokens import meta_tokens, round_tokens
from hx.replay.trace_rounds import trace_marks
from schemas.ledger import RoundDecided
from schemas.lifecycle import RoundFinished


@dataclass
class Decide:
    """Records how the stage that ended the round ended it; runs after the round's end, as every round has one."""

    name: str = ""
    after_end: bool = True

    async def recorded(self, ctx: RoundContext) -> RoundDecided | None:
        """The round's ``RoundDecided`` (the loop never runs a decided round again)."""
        return ctx.records.decided

    async def run(self, ctx: RoundContext) -> RoundDecided:
        """Append the decision: outcome, reason, ships, the round's metrics and the idle streak."""
        if ctx.ending is None:
            raise PipelineError(f"round {ctx.round}: no stage ended the round (GateAndShip always does)")
        run, t, ending = ctx.run, ctx.round, ctx.ending
        state = run.state()
        idle = 0 if ending.outcome == "shipped" else state.idle + 1
        ends = await cited_ends(ctx)
        tokens = round_tokens(ends, await meta_tokens(run.trials.log, run.run_id, t))
        decision = RoundDecided(run_id=run.run_id, round=t, outcome=ending.outcome, reason=ending.reason,
                                shipped=ending.shipped, idle=idle,
                                metrics=metrics(state, t, sum(f.attempts for f in ends), tokens))
        await run.append(decision)
        return decision

    def take(self, ctx: RoundContext, output: RoundDecided) -> None:
        """The decision, for the loop and any report after it."""
        ctx.decision = output

    def show(self, output: RoundDecided) -> str:
        """The outcome and why."""
        return f"{output.outcome}: {output.reason}"


async def cited_ends(ctx: RoundContext) -> list[RoundFinished]:
    """The ends of the trace rounds the round's digest and its gate verdicts cite, read on the log: their attempts
    are the round's rollouts, and their usage its task agent's tokens. A round resumed after a kill counts what it
    used, as an uninterrupted one does."""
    rnd = ctx.run.state().ledger.rounds.get(ctx.round)
    if rnd is None:
        return []
    cited = {*(rnd.digested.trace_rounds if rnd.digested else ()), *(r for g in rnd.gates.values()
                                                                     for r in g.trace_rounds)}
    marks = await trace_marks(ctx.run.trials.log, ctx.run.run_id) if cited else {}
    return [tr.finished for r in sorted(cited) if (tr := marks.get(r)) and tr.finished is not None]
