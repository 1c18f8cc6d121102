"""Propose: the evolver's candidates for the round (at most ``candidates``), built and on the ledger.

A round with no candidate ends here as a no-op, with the evolver's notes (or its error) as reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hx.aegis.candidates import candidate_of
from hx.aegis.errors import EvolverError, PipelineError
from hx.aegis.evidence import Evidence
from hx.aegis.evolvers.base import Context, Proposal
from hx.aegis.gate import CodeCheck
from hx.aegis.stage import RoundContext
from hx.aegis.state import RunState
from schemas.ledger import CandidateProposed


@dataclass(frozen=True)
class Proposed:
    """The round's candidates, and why there are none when the evolver says."""

    candidates: list[CandidateProposed]
    notes: list[str] = field(default_factory=list)


def context(ctx: RoundContext) -> Context:
    """What the evolver sees of the round: the run's state, the landscape and the digests."""
    if ctx.landscape is None or ctx.digested is None:
        raise PipelineError("the evolver needs the round's digests and landscape: put Digest and Plan before it")
    evidence = Evidence(ctx.run.trials.log, ctx.run.run_id)
    return Context(ctx.round, ctx.run.state(), ctx.landscape.landscape, tuple(ctx.digested.digests),
                   evidence=evidence, trace_rounds=tuple(ctx.digested.trace_rounds), settings=ctx.run.settings)


async def candidate(ctx: RoundContext, cid: str, proposal: Proposal, state: RunState,
                    code_check: CodeCheck | None) -> CandidateProposed:
    """A proposal built against its variant's harness (new code built in ``code_check``'s sandbox)."""
    return await candidate_of(proposal, state.variants[proposal.variant].harness, run_id=ctx.run.run_id,
                              round=ctx.round, candidate=cid, evolver=ctx.run.evolver.name, code_check=code_check)


@dataclass
class Propose:
    """Asks the run's evolver for candidates; ``code_check`` builds those that bring new code."""

    code_check: CodeCheck | None = None
    name: str = "propose"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> Proposed | None:
        """The round's ``CandidateProposed`` events."""
        proposed = ctx.records.proposed
        return Proposed(list(proposed)) if proposed else None

    async def run(self, ctx: RoundContext) -> Proposed:
        """Ask, build, append; an evolver that fails makes no candidate, and says why."""
        run = ctx.run
        evolver, limit = run.evolver, run.settings.candidates
        seen = context(ctx)
        try:
            proposals = await evolver.propose(seen, limit)
        except EvolverError as exc:
            return Proposed([], [f"evolver {evolver.name}: {exc}"])
        except Exception as exc:  # noqa: BLE001 - a broken evolver makes a no-op round, recorded with its reason
            return Proposed([], [f"evolver {evolver.name} failed: {type(exc).__name__}: {exc}"])
        notes = list(getattr(evolver, "notes", []))
        out = []
        for i, proposal in enumerate(proposals[:limit], 1):
            out.append(await candidate(ctx, f"C-R{ctx.round}-{i:02d}", proposal, seen.state, self.code_check))
        await run.append(*out)
        return Proposed(out, notes)

    def take(self, ctx: RoundContext, output: Proposed) -> None:
        """The candidates, for the critic; none ends the round."""
        ctx.candidates, ctx.notes = output.candidates, output.notes
        if not output.candidates:
            ctx.end("no_candidate", "; ".join(output.notes) or "the evolver found no applicable edit")

    def show(self, output: Proposed) -> str:
        """How many candidates."""
        return f"{len(output.candidates)} candidate(s)"
