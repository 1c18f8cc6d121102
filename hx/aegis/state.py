"""The loop's view of a run, folded from its ledger records alone: variants, routing, history, levers, model.

Nothing the loop decides comes from memory that is not on the ledger: ``RunState.of``
folds the run's ledger events (as the ``Ledger`` aggregate holds them, or as read back on
resume) into the variants and their harnesses, the routing of task clusters, every task's
pass@k history, the ships with their predictions, each lever's record, the strategy
concern and bans in force, approvals pending, the model in force since which round, and the
round to run next.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from hx.harness.config import HarnessConfig
from schemas.edits import AnyEditOp, Attach, Manifest, Remove, Reparam, Replace
from schemas.landscape import TaskDigest
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    GateJudged,
    HarnessShipped,
    LedgerEvent,
    LedgerOpened,
    ModelChanged,
    RoundDecided,
    RoundDigested,
    VariantForked,
    VariantRetired,
)


def lever_of(op: AnyEditOp) -> str:
    """The lever an operation pulls: a processor type attached or swapped in, or an edit of a group."""
    if isinstance(op, Attach | Replace):
        return op.processor
    if isinstance(op, Remove):
        return f"remove:{op.group}"
    assert isinstance(op, Reparam)
    return f"reparam:{op.group}"


def levers_of(operations: Iterable[AnyEditOp]) -> tuple[str, ...]:
    """The levers some operations pull, each once, in order."""
    return tuple(dict.fromkeys(lever_of(op) for op in operations))


@dataclass
class VariantState:
    """A variant: its current harness, where it came from, the clusters routed to it."""

    name: str
    harness: HarnessConfig
    parent: str = ""
    retired: bool = False
    born: int = -1


@dataclass
class Candidate:
    """A candidate as the ledger has it: proposal (latest revision), verdict, approval."""

    proposal: CandidateProposed
    gate: GateJudged | None = None
    approval: bool | None = None
    """None: not asked or not answered; True/False: the human's answer."""
    waiting: bool = False

    @property
    def id(self) -> str:
        """The candidate id."""
        return self.proposal.candidate

    @property
    def levers(self) -> tuple[str, ...]:
        """The levers its operations pull."""
        return levers_of(self.proposal.operations)


@dataclass
class Ship:
    """A shipped edit (a ship or a fork) with the prediction it made."""

    round: int
    variant: str
    candidate: str
    levers: tuple[str, ...]
    buckets: tuple[str, ...]
    manifest: Manifest


@dataclass
class RunState:
    """Everything the loop knows about a run, from its ledger."""

    opened: LedgerOpened
    variants: dict[str, VariantState] = field(default_factory=dict)
    routing: dict[str, str] = field(default_factory=dict)
    """Task cluster -> variant."""
    digests: dict[int, tuple[TaskDigest, ...]] = field(default_factory=dict)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    ships: list[Ship] = field(default_factory=list)
    decisions: dict[int, RoundDecided] = field(default_factory=dict)
    concern: str = ""
    banned: tuple[str, ...] = ()
    banned_round: int = -1
    """The round whose critic issued the ban (it holds for the round after)."""
    model: str = ""
    """The task agent's model in force (the run's configured one until a ``ModelChanged``)."""
    model_since: int = 0
    """The round it came into force: verdicts of earlier rounds were made under another model."""

    @classmethod
    def of(cls, records: Iterable[LedgerEvent]) -> RunState:
        """Fold a run's ledger records (the first must be its ``LedgerOpened``)."""
        it = iter(records)
        opened = next(it)
        if not isinstance(opened, LedgerOpened):
            raise ValueError(f"a run's ledger starts with ledger.opened, not {type(opened).TYPE}")
        state = cls(opened, {opened.variant: VariantState(opened.variant, HarnessConfig.from_dict(opened.harness))},
                    model=str(opened.settings.get("model", "")))
        for record in it:
            state.fold(record)
        return state

    def fold(self, record: LedgerEvent) -> None:
        """Apply one ledger record."""
        if isinstance(record, RoundDigested):
            self.digests[record.round] = record.digests
        elif isinstance(record, CandidateProposed):
            self.candidates[record.candidate] = Candidate(record)
        elif isinstance(record, CandidateRevised):
            cand = self.candidates[record.candidate]
            cand.proposal = revised(cand.proposal, record)
        elif isinstance(record, CriticJudged):
            self.concern, self.banned, self.banned_round = record.strategy_concern, record.banned, record.round
        elif isinstance(record, GateJudged):
            self.candidates[record.candidate].gate = record
        elif isinstance(record, ApprovalRequested):
            self.candidates[record.candidate].waiting = True
        elif isinstance(record, ApprovalGiven):
            cand = self.candidates[record.candidate]
            cand.approval, cand.waiting = record.approved, False
        elif isinstance(record, HarnessShipped):
            self.variants[record.variant].harness = HarnessConfig.from_dict(record.harness)
            for cid in record.candidates:
                self._ship(record.round, record.variant, cid)
        elif isinstance(record, VariantForked):
            self.variants[record.variant] = VariantState(record.variant, HarnessConfig.from_dict(record.harness),
                                                         parent=record.parent, born=record.round)
            for cluster in record.clusters:
                self.routing[cluster] = record.variant
            self._ship(record.round, record.variant, record.candidate)
        elif isinstance(record, VariantRetired):
            self.variants[record.variant].retired = True
            self.routing = {c: v for c, v in self.routing.items() if v != record.variant}
        elif isinstance(record, RoundDecided):
            self.decisions[record.round] = record
        elif isinstance(record, ModelChanged):
            self.model, self.model_since = record.model, record.round

    def _ship(self, round: int, variant: str, candidate: str) -> None:
        cand = self.candidates[candidate]
        self.ships.append(Ship(round, variant, candidate, cand.levers, cand.proposal.buckets, cand.proposal.manifest))

    # --- questions the stages ask -------------------------------------------------------

    @property
    def next_round(self) -> int:
        """The first round without a decision."""
        return max(self.decisions, default=-1) + 1

    @property
    def idle(self) -> int:
        """Rounds in a row without a ship, as of the last decision."""
        last = max(self.decisions, default=None)
        return 0 if last is None else self.decisions[last].idle

    def live(self) -> dict[str, VariantState]:
        """The variants not retired."""
        return {n: v for n, v in self.variants.items() if not v.retired}

    def route(self, cluster: str) -> str:
        """The variant a task cluster runs under."""
        variant = self.routing.get(cluster, self.opened.variant)
        return variant if variant in self.live() else self.opened.variant

    def task_history(self, before: int) -> dict[str, list[bool]]:
        """Each task's pass@k states in the rounds before ``before``, oldest first."""
        out: dict[str, list[bool]] = {}
        for rnd in sorted(r for r in self.digests if r < before):
            for d in self.digests[rnd]:
                out.setdefault(d.task, []).append(d.solved)
        return out

    def ban_in_force(self, round: int) -> tuple[str, ...]:
        """The levers the last strategy concern bans for ``round`` (the round after the critic's)."""
        return self.banned if self.banned_round == round - 1 else ()

    def pending(self) -> list[Candidate]:
        """Candidates that passed the gate and wait for (or have) a human's answer, not yet shipped."""
        shipped = {s.candidate for s in self.ships}
        return [c for c in self.candidates.values()
                if c.gate is not None and c.gate.passed and c.id not in shipped and (c.waiting or c.approval)]


def revised(proposal: CandidateProposed, revision: CandidateRevised) -> CandidateProposed:
    """The proposal as a revision left it."""
    return msgspec.structs.replace(proposal, operations=revision.operations, manifest=revision.manifest,
                                   digest=revision.digest, build_error=revision.build_error)
