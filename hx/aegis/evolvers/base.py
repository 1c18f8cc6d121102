"""The evolver port: given the landscape, propose up to K typed candidates, each with its manifest.

Evolvers are pluggable (``offline``: a search over library processors, no network;
``llm``: a meta-model through the router). Both return ``Proposal`` values: a target
variant, typed operations and a manifest; the loop names, builds, digests and records
them. An evolver may be asked once per candidate to revise a proposal the critic found
unsupported.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from hx.aegis.state import RunState
from schemas.errors import HxError
from schemas.ledger import AnyEditOp, CodeAsset, Landscape, Manifest, TaskDigest


class EvolverError(HxError):
    """An evolver cannot be built or used as configured."""


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


class Evolver(ABC):
    """Proposes candidates for a round."""

    name: str = ""

    @abstractmethod
    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """Up to ``k`` candidates (none when nothing applicable is left)."""

    async def revise(self, context: Context, proposal: Proposal, request: str,
                     supported: Sequence[str]) -> Proposal | None:
        """A revised proposal after the critic's request (default: keep only the supported predictions)."""
        manifest = proposal.manifest
        flips = tuple(t for t in manifest.predicted_flips if t in set(supported))
        if not flips:
            return None
        evidence = tuple(a for d in context.digests if d.task in flips for a in d.evidence)[:8]
        return Proposal(proposal.variant, proposal.operations,
                        Manifest(intended_effect=manifest.intended_effect, categories=manifest.categories,
                                 predicted_flips=flips, at_risk=manifest.at_risk, evidence=evidence,
                                 attribution=manifest.attribution), proposal.code)

    async def aclose(self) -> None:  # noqa: B027 - optional: only evolvers holding connections need it
        """Release what the evolver holds."""
