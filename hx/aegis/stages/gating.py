"""Gate and ship: the ranked candidates through the deterministic gate (``hx.aegis.gate``), then shipped.

Per variant the first candidate that passes ships, with the bucket-disjoint ones after it; a
split edit forks under ``ensemble`` (once a round); a candidate riskier than
``risk_threshold`` waits for a human (``approver``, or ``hx approve`` later). Every verdict
is on the ledger before anything ships; a resumed round uses the verdicts and answers it
already recorded. The stage always ends the round: shipped, waiting or all rejected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hx.aegis.errors import PipelineError
from hx.aegis.gate import CodeCheck, SuiteCheck, judge
from hx.aegis.shipping import fork, ship
from hx.aegis.stage import CodeSource, Ending, RoundContext
from hx.aegis.state import RunState
from hx.gate.rule import Verdict
from hx.harness.edits import apply
from schemas.ledger import ApprovalGiven, ApprovalRequested, CandidateProposed, GateJudged

Approver = Callable[[CandidateProposed, Verdict], Awaitable[bool]]
"""Asks a human whether a risky candidate that passed the gate may ship."""


@dataclass
class GateAndShip:
    """Gates the critic's ranking and ships what passes; ``code_check`` sandboxes new code, ``code_source`` gives
    its texts for the leakage scan, ``approver`` answers for risky candidates (None: they wait)."""

    code_check: CodeCheck | None = None
    code_source: CodeSource | None = None
    approver: Approver | None = None
    suite_check: SuiteCheck | None = None
    """Plays the eval suite for the ``suite`` check of a run that asks for it (None: the check is off)."""
    name: str = "gate"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> Ending | None:
        """Never as a whole (a decided round does not run again): each verdict and answer is, and is reused."""
        return None

    async def run(self, ctx: RoundContext) -> Ending:
        """Gate in ranking order, then ship per variant; the round's outcome."""
        if ctx.judged is None:
            raise PipelineError("the gate needs the critic's ranking: put Criticise before GateAndShip")
        run, t, settings = ctx.run, ctx.round, ctx.run.settings
        state = run.state()
        shipped: dict[str, list[CandidateProposed]] = {}
        forked = waiting = False
        rejected: list[str] = []
        for cid in ctx.judged.ranking:
            cand = state.candidates[cid].proposal
            variant = cand.variant
            taken = {b for c in shipped.get(variant, []) for b in c.buckets}
            if variant not in state.live() or (variant in shipped and taken & set(cand.buckets)) or (
                    forked and variant not in shipped):
                continue
            verdict, gate = await self._gate(ctx, cand, state)
            if not verdict.passed:
                rejected.append(f"{cid}: {gate.first_failure}")
                continue
            if cand.risk > settings.risk_threshold and not await self._approved(ctx, cand, verdict):
                waiting = waiting or run.state().candidates[cid].waiting
                continue
            if verdict.outcome == "fork":
                if not forked and settings.strategy == "ensemble":
                    await fork(run, t, cand, verdict, state, max_variants=settings.max_variants,
                               digests=run.trials.digests)
                    forked = True
                continue
            shipped.setdefault(variant, []).append(cand)
        for variant, cands in shipped.items():
            await ship(run, t, variant, cands)
        ids = tuple(c.candidate for cs in shipped.values() for c in cs)
        if ids or forked:
            done = [f"{len(cs)} edit(s) to {v}" for v, cs in shipped.items()] + ["a variant forked"] * forked
            why = ", ".join(done) + (f"; rejected {'; '.join(rejected)}" if rejected else "")
            return Ending("shipped", why, ids)
        if waiting:
            return Ending("waiting", "a candidate that passed the gate waits for approval")
        return Ending("all_rejected", "; ".join(rejected) or "no candidate reached the gate")

    async def _gate(self, ctx: RoundContext, cand: CandidateProposed, state: RunState) -> tuple[Verdict, GateJudged]:
        recorded = state.candidates[cand.candidate].gate
        if recorded is not None:
            return Verdict.of(recorded), recorded
        run = ctx.run
        base = state.variants[cand.variant].harness
        sources = await self.code_source(cand) if (cand.code and self.code_source) else ()
        verdict = await judge(cand, lambda: apply(base, cand.operations), base, run.trials, run.forbidden,
                              allow_fork=run.settings.strategy == "ensemble", code_check=self.code_check,
                              sources=sources, interval=run.settings.gate.interval, suite=self.suite_check,
                              rule=run.settings.gate.rule)
        gate = GateJudged(run_id=run.run_id, round=ctx.round, candidate=cand.candidate, variant=cand.variant,
                          passed=verdict.passed, checks=tuple(verdict.checks), first_failure=verdict.first_failure,
                          flips=tuple(verdict.flips), outcome=verdict.outcome, clusters=verdict.clusters,
                          trace_rounds=verdict.trace_rounds)
        await run.append(gate)
        return verdict, gate

    async def _approved(self, ctx: RoundContext, cand: CandidateProposed, verdict: Verdict) -> bool:
        run, threshold = ctx.run, ctx.run.settings.risk_threshold
        record = run.state().candidates[cand.candidate]
        if record.approval is not None:
            return record.approval
        if not record.waiting:
            await run.append(ApprovalRequested(run_id=run.run_id, round=ctx.round, candidate=cand.candidate,
                                               risk=cand.risk, reason=f"risk {cand.risk:.2f} > threshold "
                                                                      f"{threshold:.2f}"))
        if self.approver is None:
            return False
        answer = await self.approver(cand, verdict)
        await run.append(ApprovalGiven(run_id=run.run_id, candidate=cand.candidate, approved=answer, by="prompt"))
        return answer

    def take(self, ctx: RoundContext, output: Ending) -> None:
        """The gate always ends the round."""
        ctx.end(output.outcome, output.reason, output.shipped)

    def show(self, output: Ending) -> str:
        """The outcome."""
        return output.outcome + (f" {', '.join(output.shipped)}" if output.shipped else "")
