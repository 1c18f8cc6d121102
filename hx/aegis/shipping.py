"""Shipping: a passed verdict applied to the variants, as ledger events (Algorithm 1's last step).

A ship applies the operations of a variant's passing candidates together
(``HarnessShipped``); when they do not compose, the first (the critic's best) ships alone.
A split edit under the ``ensemble`` strategy forks a new variant (``VariantForked``); when
the pool is full the weakest variant is retired first (``VariantRetired``), and with none
to retire there is no fork. A candidate a human approved after its round ships (or forks)
at the start of a later one, if its variant still has the harness it was judged on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from hx.aegis.state import RunState
from hx.aegis.variants import fork_name, pool_full, weakest
from hx.gate.rule import Verdict
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from schemas.landscape import TaskDigest
from schemas.ledger import CandidateProposed, HarnessShipped, LedgerEvent, VariantForked, VariantRetired


class Run(Protocol):
    """What shipping needs of an evolution run: its id, its state as its ledger has it now, and that ledger."""

    @property
    def run_id(self) -> str:
        """The run."""
        ...

    def state(self) -> RunState:
        """The run's state as its ledger has it now."""
        ...

    async def append(self, *events: LedgerEvent) -> None:
        """Append to the run's ledger."""
        ...


async def ship(run: Run, t: int, variant: str, cands: Sequence[CandidateProposed]) -> None:
    """Ship ``cands`` to ``variant`` in round ``t``: their operations together, or the first alone if they clash."""
    state = run.state()
    base = state.variants[variant].harness
    ops = tuple(op for c in cands for op in c.operations)
    try:
        harness = apply(base, ops)
    except CompositionError:
        # each was gated alone; bucket-disjoint edits can still clash together (one group edited twice)
        cands, ops = cands[:1], cands[0].operations
        harness = apply(base, ops)
    await run.append(HarnessShipped(run_id=run.run_id, round=t, variant=variant,
                                    candidates=tuple(c.candidate for c in cands), digest_before=base.digest,
                                    digest_after=harness.digest, operations=ops, harness=harness.spec()))


async def fork(run: Run, t: int, cand: CandidateProposed, verdict: Verdict, state: RunState, *, max_variants: int,
               digests: Mapping[str, Sequence[TaskDigest]]) -> None:
    """Fork ``cand`` into a new variant, retiring the weakest first when the pool is full (none to retire: no fork)."""
    if pool_full(state, max_variants):
        victim = weakest(state, [d for ds in digests.values() for d in ds])
        if victim is None:
            return
        await run.append(VariantRetired(run_id=run.run_id, round=t, variant=victim,
                                        reason=f"the pool of {max_variants} variants was full"))
        state = run.state()
    harness = apply(state.variants[cand.variant].harness, cand.operations)
    await run.append(VariantForked(run_id=run.run_id, round=t, parent=cand.variant, variant=fork_name(state),
                                   candidate=cand.candidate, digest=harness.digest, operations=cand.operations,
                                   harness=harness.spec(), clusters=verdict.clusters))


async def ship_approved(run: Run, t: int, *, max_variants: int, digests: Mapping[str, Sequence[TaskDigest]]) -> None:
    """Ship (or fork) the candidates a human approved since, if their variant has not changed meanwhile."""
    state = run.state()
    for cand in state.pending():
        proposal, gate = cand.proposal, cand.gate
        variant = state.variants.get(proposal.variant)
        if not cand.approval or gate is None or variant is None or variant.retired or \
                proposal.base_digest != variant.harness.digest:
            continue
        if gate.outcome == "fork":
            await fork(run, t, proposal, Verdict.of(gate), state, max_variants=max_variants, digests=digests)
        else:
            await ship(run, t, proposal.variant, [proposal])
        state = run.state()  # a ship changes its variant's harness: no other approval judged on the old one applies
