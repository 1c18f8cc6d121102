"""HarnessState: the harness of every variant of every evolution run, as of any round, from the ledger alone.

It folds ``HX_LEDGER``: a run's ``LedgerOpened`` gives variant ``v0`` its harness, each
``HarnessShipped`` a new version of a variant, ``VariantForked`` a new variant and
``VariantRetired`` its end. Every version is kept with the round and log position it
appeared at, so ``as_of`` answers "which harness did variant v run in round r" without
folding again; a rebuild up to a log sequence (``ProjectionRunner.as_of``) answers the
same for any position. A version's digest is the ``HarnessConfig`` digest of its harness,
the very digest the loop ran (and wrote on every attempt's ``AttemptStarted``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.ledger import HarnessShipped, LedgerOpened, VariantForked, VariantRetired
from streams.topology import LEDGER


class HarnessVersion(msgspec.Struct):
    """One version of a variant's harness and where it came from."""

    round: int
    """The evolution round it was shipped in (-1: the initial harness)."""
    seq: int
    """The ledger message that made it."""
    digest: str
    harness: dict[str, Any]
    candidates: list[str] = []


class Variant(msgspec.Struct):
    """A variant: its versions in order, its parent, and when it was retired (if it was)."""

    name: str
    versions: list[HarnessVersion] = []
    parent: str = ""
    retired_round: int | None = None

    @property
    def current(self) -> HarnessVersion:
        """The latest version."""
        return self.versions[-1]


class RunHarnesses(msgspec.Struct):
    """The variants of one run."""

    run: str
    strategy: str = ""
    variants: dict[str, Variant] = {}

    def as_of(self, round: int) -> dict[str, HarnessVersion]:
        """Each variant's harness version in force during ``round`` (shipped in earlier rounds), if it existed."""
        out: dict[str, HarnessVersion] = {}
        for name, variant in self.variants.items():
            if variant.retired_round is not None and variant.retired_round < round:
                continue
            live = [v for v in variant.versions if v.round < round]
            if live:
                out[name] = live[-1]
        return out

    def active(self) -> dict[str, HarnessVersion]:
        """The current version of each variant not retired."""
        return {n: v.current for n, v in self.variants.items() if v.retired_round is None and v.versions}


class HarnessState(Projection[dict[str, RunHarnesses]]):
    """Per run, per variant, every harness version with its round and ledger position."""

    name: ClassVar[str] = "harness_state"
    stream: ClassVar[str] = LEDGER.name
    reads = frozenset({LedgerOpened.TYPE, HarnessShipped.TYPE, VariantForked.TYPE, VariantRetired.TYPE})
    state_type = dict[str, RunHarnesses]

    def initial(self) -> dict[str, RunHarnesses]:
        """No runs yet."""
        return {}

    def fold(self, state: dict[str, RunHarnesses], record: Record) -> dict[str, RunHarnesses]:
        """Apply one ledger event to its run's variants."""
        event = record.event
        if isinstance(event, LedgerOpened):
            state[event.run_id] = RunHarnesses(event.run_id, event.strategy, {event.variant: Variant(
                event.variant, [HarnessVersion(-1, record.seq, event.digest, event.harness)])})
            return state
        run = state.get(getattr(event, "run_id", ""))
        if run is None:
            return state  # a ledger event of a run whose opening was not read: nothing to attach it to
        if isinstance(event, HarnessShipped):
            variant = run.variants.setdefault(event.variant, Variant(event.variant))
            variant.versions.append(HarnessVersion(event.round, record.seq, event.digest_after, event.harness,
                                                   list(event.candidates)))
        elif isinstance(event, VariantForked):
            run.variants[event.variant] = Variant(event.variant, [HarnessVersion(
                event.round, record.seq, event.digest, event.harness, [event.candidate])], parent=event.parent)
        elif isinstance(event, VariantRetired) and event.variant in run.variants:
            run.variants[event.variant].retired_round = event.round
        return state
