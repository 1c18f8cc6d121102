"""The evolver port: given the landscape, propose up to K typed candidates, each with its manifest.

Evolvers are pluggable (``offline``: a search over library processors, no network;
``llm``: a meta-model through the router). Both return ``Proposal`` values: a target
variant, typed operations and a manifest; the loop names, builds, digests and records
them. An evolver may be asked once per candidate to revise a proposal the critic found
unsupported.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from hx.aegis.evidence import Evidence
from hx.aegis.meta import MetaAgent
from hx.aegis.settings import EvolveSettings
from hx.aegis.state import RunState
from hx.runtime.code import CodeStore
from schemas.edits import AddRule, Anchor, AnyEditOp, CodeAsset, Manifest
from schemas.landscape import Landscape, TaskDigest


@dataclass(frozen=True)
class Proposal:
    """One candidate as an evolver proposes it."""

    variant: str
    operations: tuple[AnyEditOp, ...]
    manifest: Manifest
    code: tuple[CodeAsset, ...] = ()


@dataclass(frozen=True)
class Context:
    """What an evolver sees of a round: adaptation evidence only."""

    round: int
    state: RunState
    landscape: Landscape
    digests: tuple[TaskDigest, ...]
    evidence: Evidence | None = None
    """Read access to the run's adaptation rounds (none where the caller has no log, as in unit tests)."""
    trace_rounds: tuple[int, ...] = ()
    """The trace rounds the round's digests were made from (what ``evidence`` may read)."""
    settings: EvolveSettings | None = None
    """The run's loop settings (None: the defaults)."""


MAX_EVIDENCE = 8
"""Evidence anchors a manifest carries at most."""


def evidence_for(digests: Sequence[TaskDigest], tasks: Sequence[str]) -> tuple[Anchor, ...]:
    """The anchors of the digests of ``tasks`` (capped), in digest order: evidence comes from the digests only."""
    wanted = set(tasks)
    return tuple(a for d in digests if d.task in wanted for a in d.evidence)[:MAX_EVIDENCE]


def suspected(context: Context, variant: str) -> Iterator[tuple[str, str, AnyEditOp, tuple[str, ...]]]:
    """Each operation of a ship suspected of one of ``variant``'s regressions: (the regressed task, the suspect
    candidate, the operation, every task that candidate is suspected of breaking)."""
    regressions = context.landscape.regressions
    for reg in regressions:
        if reg.variant != variant:
            continue
        for cid in reg.suspects:
            broke = tuple(r.task for r in regressions if cid in r.suspects)
            for op in context.state.candidates[cid].proposal.operations:
                yield reg.task, cid, op, broke


Standing = Literal["new", "stale", "judged"]
"""Operations on a variant's current harness: never judged on it, judged under an earlier model only, or judged
under the model in force."""


def acting(operations: tuple[AnyEditOp, ...]) -> tuple[AnyEditOp, ...]:
    """The operations as they change a harness: a rule addition without the support it was learnt from."""
    # A later round's attempts count the same rule anew; what was judged is the rule, not the count.
    return tuple(msgspec.structs.replace(op, support=None) if isinstance(op, AddRule) else op for op in operations)


def standing(context: Context, variant: str, operations: tuple[AnyEditOp, ...]) -> Standing:
    """Whether these operations were already judged on the variant's current harness, and under which model."""
    # A verdict holds for the (harness, model) pair it judged: once co-evolution's learner has moved the policy,
    # an edit that lost solved tasks under the old one may keep them under the new, so it may be judged again.
    state = context.state
    base = state.variants[variant].harness.digest
    asked = acting(operations)
    rounds = [c.proposal.round for c in state.candidates.values() if c.proposal.variant == variant
              and c.proposal.base_digest == base and acting(c.proposal.operations) == asked]
    if not rounds:
        return "new"
    return "judged" if max(rounds) >= state.model_since else "stale"


def judged(context: Context, variant: str, operations: tuple[AnyEditOp, ...]) -> bool:
    """True when these operations were already judged on the variant's current harness under the model in force."""
    return standing(context, variant, operations) == "judged"


class Evolver(ABC):
    """Proposes candidates for a round."""

    name: str = ""

    @classmethod
    def build(cls, *, meta: MetaAgent | None, store: CodeStore | None) -> Evolver:
        """The evolver a command asks for by name, from what the command has: the meta-model (``--meta-model``)
        and the code store; ``EvolverError`` when it needs one it lacks (default: it needs neither)."""
        return cls()

    @abstractmethod
    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """Up to ``k`` candidates (none when nothing applicable is left)."""

    async def revise(self, context: Context, proposal: Proposal, request: str,
                     supported: Sequence[str]) -> Proposal | None:
        """A revised proposal after the critic's request (default: keep only the supported predictions)."""
        manifest = proposal.manifest
        backed = set(supported)
        flips = tuple(t for t in manifest.predicted_flips if t in backed)
        if not flips:
            return None
        evidence = evidence_for(context.digests, flips)
        return Proposal(proposal.variant, proposal.operations,
                        msgspec.structs.replace(manifest, predicted_flips=flips, evidence=evidence), proposal.code)

    async def aclose(self) -> None:  # noqa: B027 - optional: only evolvers holding connections need it
        """Release what the evolver holds."""


class FrozenEvolver(Evolver):
    """Proposes nothing: the harness stays as it is (co-evolution's ``model`` mode)."""

    name = "frozen"

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """No candidate, ever."""
        return []
