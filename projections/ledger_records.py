"""What the fold of a run's edit ledger keeps: each event with its place, variants and their harness versions,
candidates with their verdicts, ships, each round's records, and what could not be folded.

Data only (``msgspec`` Structs): ``projections.ledger.RunLedger`` fills them, and every reader of a run's
ledger reads them.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from schemas.edits import AddRule, AnyEditOp, Attach, Bucket, DropRule, Manifest, Remove, Replace
from schemas.harness import HarnessSpec
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    ModelChanged,
    RoundDecided,
    RoundDigested,
    VariantForked,
    VariantRetired,
)
from schemas.rules import rule_lever

ShipEvent = HarnessShipped | VariantForked


def lever_of(op: AnyEditOp) -> str:
    """The lever an operation pulls: a processor type attached or swapped in, or an edit of a group."""
    if isinstance(op, Attach | Replace):
        return op.processor
    if isinstance(op, Remove):
        return f"remove:{op.group}"
    if isinstance(op, AddRule):
        return rule_lever(op.rule)
    if isinstance(op, DropRule):
        return "drop-" + rule_lever(op.rule)
    return f"reparam:{op.group}"


def levers_of(operations: Iterable[AnyEditOp]) -> tuple[str, ...]:
    """The levers some operations pull, each once, in order."""
    return tuple(dict.fromkeys(lever_of(op) for op in operations))


def revised(proposal: CandidateProposed, revision: CandidateRevised) -> CandidateProposed:
    """The proposal as a revision left it."""
    return msgspec.structs.replace(proposal, operations=revision.operations, manifest=revision.manifest,
                                   digest=revision.digest, build_error=revision.build_error)


# --- what the fold keeps ---------------------------------------------------------------------


class LedgerEntry(msgspec.Struct, frozen=True):
    """One ledger event of a run with its place: its position in the run's ledger and its stream sequence."""

    position: int
    """1 for the run's ``ledger.opened``; the aggregate version its subject names."""
    seq: int
    """The ``HX_LEDGER`` message sequence (0 when folded from memory or read from a file)."""
    event: LedgerEvent

    @property
    def type(self) -> str:
        """The event's type name."""
        return type(self.event).TYPE

    @property
    def label(self) -> str:
        """``event 17 (ledger.gate_judged)``: how problems and listings name it."""
        return f"event {self.position} ({self.type})"


class Fault(msgspec.Struct, frozen=True):
    """An event the fold could not take, and why: what a command refuses a ledger for."""

    position: int
    type: str
    text: str
    kind: str = "structure"
    """``structure`` (an event that makes no sense where it is), ``duplicate`` (a position written twice),
    ``dropped`` (positions missing), ``reordered`` (a position after a later one), ``chain`` (``prev`` is not the
    digest of the event before)."""
    seq: int = 0

    @property
    def label(self) -> str:
        """``event 17 (ledger.gate_judged)``."""
        return f"event {self.position} ({self.type})"

    def __str__(self) -> str:
        return f"{self.label}: {self.text}"


class HarnessVersion(msgspec.Struct):
    """One version of a variant's harness, and where it came from."""

    round: int
    """The evolution round it was shipped in (-1: the initial harness)."""
    position: int
    """The ledger position of the event that made it."""
    seq: int
    digest: str
    harness: HarnessSpec
    """The harness as the ledger recorded it."""
    kind: str = "opened"
    """``opened`` (the initial harness), ``ship`` or ``fork``."""
    candidates: list[str] = []
    operations: tuple[AnyEditOp, ...] = ()
    """The operations that made it from ``base``."""
    base: str = ""
    """The digest of the harness the operations were applied to (the variant's, or the parent's for a fork)."""


class Variant(msgspec.Struct):
    """A variant: its versions in order, its parent, when it was born and retired."""

    name: str
    versions: list[HarnessVersion] = []
    parent: str = ""
    born: int = -1
    retired_round: int | None = None
    retired_position: int = 0

    @property
    def current(self) -> HarnessVersion:
        """The latest version."""
        return self.versions[-1]

    @property
    def retired(self) -> bool:
        """True once the variant left the pool."""
        return self.retired_round is not None

    def before(self, position: int) -> HarnessVersion | None:
        """The version in force just before ledger ``position`` (None: the variant did not exist yet)."""
        live = [v for v in self.versions if v.position < position]
        return live[-1] if live else None

    def during(self, round: int) -> HarnessVersion | None:
        """The version in force during ``round``: the last one shipped in an earlier round."""
        live = [v for v in self.versions if v.round < round]
        return live[-1] if live else None


class CandidateRecord(msgspec.Struct):
    """A candidate as the ledger has it: its proposal (latest revision applied), verdict, approval and ship."""

    proposal: CandidateProposed
    first: CandidateProposed
    """As first proposed, before the critic's revision."""
    position: int
    revision: CandidateRevised | None = None
    gate: GateJudged | None = None
    gate_position: int = 0
    request: ApprovalRequested | None = None
    answer: ApprovalGiven | None = None
    answer_position: int = 0
    shipped_position: int = 0
    """The position of the ship or fork that carried it (0: none)."""

    @property
    def id(self) -> str:
        """The candidate id."""
        return self.proposal.candidate

    @property
    def levers(self) -> tuple[str, ...]:
        """The levers its operations pull."""
        return levers_of(self.proposal.operations)

    @property
    def approval(self) -> bool | None:
        """None: not asked or not answered; True/False: the human's answer."""
        return self.answer.approved if self.answer is not None else None

    @property
    def waiting(self) -> bool:
        """Asked for approval and not answered yet."""
        return self.request is not None and self.answer is None


class ShipRecord(msgspec.Struct, frozen=True):
    """A ship or a fork with its place on the ledger."""

    event: ShipEvent
    position: int
    seq: int = 0

    @property
    def round(self) -> int:
        """The round it was made in."""
        return self.event.round

    @property
    def variant(self) -> str:
        """The variant whose harness it made (the new one, for a fork)."""
        return self.event.variant

    @property
    def kind(self) -> str:
        """``ship`` or ``fork``."""
        return "ship" if isinstance(self.event, HarnessShipped) else "fork"

    @property
    def candidates(self) -> tuple[str, ...]:
        """The candidates it carried."""
        return self.event.candidates if isinstance(self.event, HarnessShipped) else (self.event.candidate,)

    @property
    def on(self) -> str:
        """The variant whose harness its operations were applied to (the parent, for a fork)."""
        return self.event.variant if isinstance(self.event, HarnessShipped) else self.event.parent

    @property
    def digest(self) -> str:
        """The digest of the harness it made."""
        return self.event.digest_after if isinstance(self.event, HarnessShipped) else self.event.digest


class Ship(msgspec.Struct, frozen=True):
    """One candidate shipped (or forked), with the prediction it made."""

    round: int
    variant: str
    candidate: str
    levers: tuple[str, ...]
    buckets: tuple[Bucket, ...]
    manifest: Manifest
    position: int = 0


class RoundRecords(msgspec.Struct):
    """Everything the ledger recorded for one evolution round, in ledger order."""

    round: int
    digested: RoundDigested | None = None
    landscape: LandscapePlanned | None = None
    proposed: list[CandidateProposed] = []
    """Candidates as first proposed."""
    revised: dict[str, CandidateRevised] = {}
    critic: CriticJudged | None = None
    gates: dict[str, GateJudged] = {}
    """Candidate -> its verdict, in the order the gate judged them."""
    approvals: list[ApprovalRequested] = []
    ships: list[ShipRecord] = []
    """Harness ships and forks of this round."""
    retired: list[VariantRetired] = []
    heldout: list[HeldoutScored] = []
    decided: RoundDecided | None = None
    between: list[ShipRecord] = []
    """Ships and forks recorded after the previous round's digest and before this round's."""
    model: ModelChanged | None = None
