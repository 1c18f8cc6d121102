"""The loop's view of a run: the ledger's one fold (``projections.ledger.RunLedger``) with its harnesses built.

Nothing the loop decides comes from memory that is not on the ledger: ``RunState`` is the
fold of the run's ledger events (as the ``Ledger`` aggregate holds them, or as read back on
resume), and adds only what a fold holding data cannot: each variant's harness as a built
``HarnessConfig`` (built once per digest). Every question about candidates, ships, routing,
task history, bans, approvals and the model in force is the fold's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hx.harness.config import HarnessConfig
from hx.replay.errors import LedgerRefused
from projections.ledger import RunLedger
from projections.ledger_records import CandidateRecord, Ship
from schemas.harness import HarnessSpec
from schemas.landscape import Regression, TaskDigest
from schemas.ledger import LedgerEvent, LedgerOpened, RoundDecided


@dataclass
class VariantState:
    """A variant with its current harness built: where it came from, whether it left the pool."""

    name: str
    harness: HarnessConfig
    parent: str = ""
    retired: bool = False
    born: int = -1


@dataclass
class RunState:
    """Everything the loop knows about a run: its ledger's fold, and each variant's harness built."""

    ledger: RunLedger
    _built: dict[str, HarnessConfig] = field(default_factory=dict, repr=False)
    """Digest -> the harness built from the ledger's record of it."""

    @classmethod
    def of(cls, records: Iterable[LedgerEvent]) -> RunState:
        """Fold a run's ledger records (the first must be its ``LedgerOpened``); ``LedgerRefused`` if they do not."""
        state = cls(RunLedger())
        for record in records:
            state.fold(record)
        if state.ledger.opened is None:
            raise LedgerRefused("a run's ledger starts with ledger.opened")
        return state

    def fold(self, record: LedgerEvent) -> None:
        """Take the next ledger record; ``LedgerRefused`` naming it when it does not fold.

        The chain is not this fold's concern: the records come from the ``Ledger`` aggregate,
        which refuses a broken chain as it loads and appends (and commands verify it first).
        """
        before = len(self.ledger.faults)
        self.ledger.fold(record)
        fault = next((f for f in self.ledger.faults[before:] if f.kind != "chain"), None)
        if fault is not None:
            raise LedgerRefused(f"the ledger of run {self.ledger.run_id or record.run_id!r} does not fold: {fault}")

    def harness(self, digest: str, recorded: HarnessSpec) -> HarnessConfig:
        """The harness the ledger recorded under ``digest``, built once."""
        built = self._built.get(digest)
        if built is None:
            built = self._built[digest] = HarnessConfig.from_spec(recorded)
        return built

    # --- the fold, as the stages read it --------------------------------------------------------

    @property
    def opened(self) -> LedgerOpened:
        """The run's first ledger event."""
        assert self.ledger.opened is not None
        return self.ledger.opened

    @property
    def variants(self) -> dict[str, VariantState]:
        """Every variant ever made, with its current harness."""
        return {name: VariantState(name, self.harness(v.current.digest, v.current.harness), v.parent, v.retired,
                                   v.born) for name, v in self.ledger.variants.items()}

    def live(self) -> dict[str, VariantState]:
        """The variants not retired."""
        return {n: v for n, v in self.variants.items() if not v.retired}

    @property
    def routing(self) -> dict[str, str]:
        """Task cluster -> variant."""
        return self.ledger.routing

    @property
    def digests(self) -> dict[int, tuple[TaskDigest, ...]]:
        """Round -> its task digests."""
        return self.ledger.digests

    @property
    def candidates(self) -> dict[str, CandidateRecord]:
        """Candidate id -> its record (proposal as revised, verdict, approval)."""
        return self.ledger.candidates

    @property
    def ships(self) -> list[Ship]:
        """Every candidate shipped or forked, in order."""
        return self.ledger.ships

    @property
    def decisions(self) -> dict[int, RoundDecided]:
        """Round -> its decision."""
        return self.ledger.decisions

    @property
    def concern(self) -> str:
        """The last critic's strategy concern."""
        return self.ledger.concern

    @property
    def banned(self) -> tuple[str, ...]:
        """The levers the last strategy concern banned."""
        return self.ledger.banned

    @property
    def banned_round(self) -> int:
        """The round whose critic issued the ban (it holds for the round after)."""
        return self.ledger.banned_round

    @property
    def model(self) -> str:
        """The task agent's model in force (the run's configured one until a ``ModelChanged``)."""
        return self.ledger.model

    @property
    def model_since(self) -> int:
        """The round the model in force came into force: verdicts of earlier rounds were made under another."""
        return self.ledger.model_since

    @property
    def next_round(self) -> int:
        """The first round without a decision."""
        return self.ledger.next_round

    @property
    def idle(self) -> int:
        """Rounds in a row without a ship, as of the last decision."""
        return self.ledger.idle

    def route(self, cluster: str) -> str:
        """The variant a task cluster runs under."""
        return self.ledger.route(cluster)

    def task_history(self, before: int) -> dict[str, list[bool]]:
        """Each task's pass@k states in the rounds before ``before``, oldest first."""
        return self.ledger.task_history(before)

    def ban_in_force(self, round: int) -> tuple[str, ...]:
        """The levers the last strategy concern bans for ``round``."""
        return self.ledger.ban_in_force(round)

    def pending(self) -> list[CandidateRecord]:
        """Candidates that passed the gate and wait for (or have) a human's answer, not yet shipped."""
        return self.ledger.pending_approval()

    def regressions(self, round: int, digests: Sequence[TaskDigest]) -> tuple[Regression, ...]:
        """Tasks solved in the previous round and not in ``digests``, with the ships to their variant since."""
        return self.ledger.regressions(round, digests)
