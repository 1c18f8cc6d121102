"""Criticise: the critic ranks the round's candidates (one revision at most, ``hx.aegis.critic``), on the ledger.

A round whose critic finds no candidate backed by evidence ends here as a no-op.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from hx.aegis import critic as deterministic_critic
from hx.aegis.critic import Review
from hx.aegis.errors import EvolverError, PipelineError
from hx.aegis.evolvers.base import Proposal
from hx.aegis.gate import CodeCheck
from hx.aegis.stage import RoundContext
from hx.aegis.stages.propose import candidate, context
from hx.aegis.state import RunState
from hx.replay.ledger_view import headline
from projections.ledger_records import revised
from schemas.landscape import TaskDigest
from schemas.ledger import CandidateProposed, CandidateRevised, CriticJudged

CriticFn = Callable[[RunState, int, Sequence[CandidateProposed], Sequence[TaskDigest], bool], Awaitable[Review]]
"""A critic in place of the deterministic one (``LlmCritic``): (state, round, candidates, digests, revised)."""


@dataclass
class Criticise:
    """Reviews the candidates, has the evolver revise those asked to, reviews again; ``critic`` may replace the
    deterministic review, ``code_check`` builds revisions that bring new code."""

    critic: CriticFn | None = None
    code_check: CodeCheck | None = None
    name: str = "criticise"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> CriticJudged | None:
        """The round's ``CriticJudged``."""
        return ctx.records.critic

    async def run(self, ctx: RoundContext) -> CriticJudged:
        """Review, revise once, review again; the revisions and the verdict go on the ledger."""
        if ctx.digested is None:
            raise PipelineError("the critic needs the round's digests: put Digest before Criticise")
        run, t, digests = ctx.run, ctx.round, ctx.digested.digests
        first = await self._review(ctx, ctx.candidates, digests, revised=False)
        seen = context(ctx)
        current = {c.candidate: c for c in ctx.candidates}
        for cid, request in first.revisions.items():
            cand = current[cid]
            backed = deterministic_critic.supported(cand, digests)
            try:
                proposal = await run.evolver.revise(seen, Proposal(cand.variant, cand.operations, cand.manifest,
                                                                   cand.code), request, backed)
            except EvolverError:
                proposal = None
            if proposal is None:
                continue
            rebuilt = await candidate(ctx, cid, proposal, seen.state, self.code_check)
            revision = CandidateRevised(run_id=run.run_id, round=t, candidate=cid, reason=request,
                                        operations=rebuilt.operations, manifest=rebuilt.manifest,
                                        digest=rebuilt.digest, build_error=rebuilt.build_error)
            await run.append(revision)
            current[cid] = revised(cand, revision)
        final = await self._review(ctx, list(current.values()), digests, revised=True)
        judged = CriticJudged(run_id=run.run_id, round=t, ranking=final.ranking, no_op=final.no_op,
                              concerns=final.concern_list(), revisions=tuple(first.revisions),
                              strategy_concern=final.strategy_concern, banned=final.banned,
                              critic="llm" if self.critic else "deterministic", overlaps=final.overlap_list(),
                              unaddressed=final.unaddressed)
        await run.append(judged)
        return judged

    async def _review(self, ctx: RoundContext, candidates: Sequence[CandidateProposed],
                      digests: Sequence[TaskDigest], *, revised: bool) -> Review:
        if self.critic is not None:
            return await self.critic(ctx.run.state(), ctx.round, candidates, digests, revised)
        return deterministic_critic.review(ctx.run.state(), ctx.round, candidates, digests, revised=revised)

    def take(self, ctx: RoundContext, output: CriticJudged) -> None:
        """The ranking, for the gate; no candidate backed by evidence ends the round."""
        ctx.judged = output
        if output.no_op:
            ctx.end("all_rejected", f"regression(s) {', '.join(output.unaddressed)} neither addressed nor accepted "
                    "with a reason" if output.unaddressed else "the critic found no candidate backed by evidence")

    def show(self, output: CriticJudged) -> str:
        """The ranking, as ``hx ledger`` shows it."""
        return headline(output)
