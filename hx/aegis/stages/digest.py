"""Digest: the round's attempts compressed into one ``TaskDigest`` per task (``hx.aegis.digester``), on the ledger.

A round whose actionability is below ``alpha`` ends here as a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

from hx.aegis.digester import ProseWriter, actionability, digest_round, with_prose
from hx.aegis.errors import PipelineError
from hx.aegis.evidence import Evidence
from hx.aegis.stage import RoundContext
from schemas.ledger import RoundDigested


@dataclass
class Digest:
    """Digests the rollouts ``Rollouts`` played; ``prose`` (an LLM pass) may add a summary per failing task."""

    prose: ProseWriter | None = None
    name: str = "digest"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> RoundDigested | None:
        """The round's ``RoundDigested``."""
        return ctx.records.digested

    async def run(self, ctx: RoundContext) -> RoundDigested:
        """Read the rollouts' attempts off the trace, digest them, append the digest."""
        if ctx.played is None:
            raise PipelineError("the digest stage needs the round's rollouts: put Rollouts before Digest")
        run, t, played = ctx.run, ctx.round, ctx.played
        facts = await Evidence(run.trials.log, run.run_id).attempts(list(played.trace_rounds))
        digests = digest_round(facts, played.variants, run.state().task_history(t))
        if self.prose is not None:
            digests = with_prose(digests, await self.prose(digests, t))
        digested = RoundDigested(run_id=run.run_id, round=t, actionability=round(actionability(digests), 4),
                                 digests=digests, trace_rounds=played.trace_rounds, rested=tuple(sorted(played.rested)))
        await run.append(digested)
        return digested

    def take(self, ctx: RoundContext, output: RoundDigested) -> None:
        """The digests, for the planner and the gate; a round below ``alpha`` ends."""
        ctx.digested = output
        digests = output.digests
        ctx.run.trials.digests = {v: tuple(d for d in digests if d.variant == v) for v in {d.variant for d in digests}}
        alpha = ctx.run.settings.alpha
        if output.actionability < alpha:
            ctx.end("below_actionability", f"actionability {output.actionability:.2f} < alpha {alpha:.2f}")

    def show(self, output: RoundDigested) -> str:
        """Tasks solved and the round's actionability."""
        solved = sum(d.solved for d in output.digests)
        return f"{solved}/{len(output.digests)} task(s) solved, actionability {output.actionability:.2f}"
