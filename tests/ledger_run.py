"""A run's edit ledger written event by event, as the loop would, for tests of the stages that fold it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

from hx.aegis.ledger import Ledger
from hx.aegis.operations import buckets_of, dimensions_of
from hx.aegis.state import RunState
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.processor import processor_type
from hx.harnesses import starter_harness
from schemas.edits import AnyEditOp, Attach, Manifest
from schemas.landscape import TaskDigest
from schemas.ledger import (
    CandidateProposed,
    CriticJudged,
    GateCheck,
    GateJudged,
    HarnessShipped,
    LedgerEvent,
    LedgerOpened,
    ModelChanged,
    RoundDigested,
    VariantForked,
)
from streams.config import NatsSettings
from streams.connection import connect

STARTER = starter_harness("textworld")
GATE_CHECKS = ("manifest", "config", "smoke", "leakage", "counterfactual", "seesaw", "effect")


def attach(name: str, **params: object) -> Attach:
    """Attach a library processor at every hook it serves, with ``params``."""
    return Attach(processor=name, hooks=processor_type(name).accepted_hooks(), params=dict(params))


def task(name: str, *, passes: int = 0, category: str = "", variant: str = "v0",
         implicated: tuple[str, ...] = ()) -> TaskDigest:
    """One task's digest (two attempts)."""
    if not passes and not category:
        category = "no_progress"
    return TaskDigest(task=name, cluster=":".join(name.split(":")[:2]), variant=variant, attempts=2, passes=passes,
                      category="" if passes else category, implicated=implicated)


class LedgerRun:
    """The records of one run, starting at its ``LedgerOpened``, and the state they fold into."""

    def __init__(self, harness: HarnessConfig = STARTER, run_id: str = "ledger-run") -> None:
        self.run_id = run_id
        self.records: list[LedgerEvent] = [LedgerOpened(run_id=run_id, strategy="ensemble", harness=harness.spec(),
                                                        digest=harness.digest)]

    @property
    def state(self) -> RunState:
        """The run's state as of the last record."""
        return RunState.of(self.records)

    def digested(self, round: int, digests: Sequence[TaskDigest]) -> tuple[TaskDigest, ...]:
        """Record a round's digests."""
        self.records.append(RoundDigested(run_id=self.run_id, round=round, actionability=1.0, digests=tuple(digests)))
        return tuple(digests)

    def proposed(self, round: int, cid: str, ops: tuple[AnyEditOp, ...], flips: Sequence[str] = (),
                 variant: str = "v0") -> CandidateProposed:
        """Record a candidate on its variant's current harness."""
        base = self.state.variants[variant].harness
        cand = CandidateProposed(run_id=self.run_id, round=round, candidate=cid, variant=variant, evolver="test",
                                 operations=ops, buckets=buckets_of(ops), dimensions=dimensions_of(ops, base),
                                 manifest=Manifest(intended_effect="t", predicted_flips=tuple(flips)),
                                 base_digest=base.digest, digest=apply(base, ops).digest)
        self.records.append(cand)
        return cand

    def model_changed(self, round: int, model: str) -> None:
        """Record that the task agent runs ``model`` from ``round`` on (co-evolution's next policy)."""
        self.records.append(ModelChanged(run_id=self.run_id, round=round, model=model, previous=self.state.model))

    def gated(self, round: int, cid: str, outcome: Literal["ship", "fork"] = "ship",
              clusters: tuple[str, ...] = ()) -> None:
        """Record the gate's passing verdict on a proposed candidate (every check passed; a fork failed the seesaw)."""
        if self.state.candidates[cid].gate is not None:
            return
        names = GATE_CHECKS if outcome == "ship" else GATE_CHECKS[:-1]
        checks = tuple(GateCheck(name=n, passed=outcome == "ship" or n != "seesaw") for n in names)
        self.records.append(GateJudged(run_id=self.run_id, round=round, candidate=cid,
                                       variant=self.state.candidates[cid].proposal.variant, passed=True,
                                       checks=checks, first_failure="" if outcome == "ship" else "seesaw",
                                       outcome=outcome, clusters=clusters))

    def shipped(self, round: int, cid: str, variant: str | None = None) -> None:
        """Record the ship of a proposed candidate (to its own variant unless told), after its passing verdict."""
        self.gated(round, cid)
        cand = self.state.candidates[cid].proposal
        variant = variant or cand.variant
        before = self.state.variants[variant].harness
        after = apply(before, cand.operations)
        self.records.append(HarnessShipped(run_id=self.run_id, round=round, variant=variant, candidates=(cid,),
                                           digest_before=before.digest, digest_after=after.digest,
                                           operations=cand.operations, harness=after.spec()))

    def ship(self, round: int, cid: str, ops: tuple[AnyEditOp, ...], flips: Sequence[str]) -> None:
        """Propose and ship in one go."""
        self.proposed(round, cid, ops, flips)
        self.shipped(round, cid)

    def forked(self, round: int, cid: str, variant: str, clusters: tuple[str, ...]) -> None:
        """Record a fork of v0 into ``variant`` by a proposed candidate, after its passing verdict."""
        self.gated(round, cid, "fork", clusters)
        cand = self.state.candidates[cid].proposal
        harness = apply(self.state.variants["v0"].harness, cand.operations)
        self.records.append(VariantForked(run_id=self.run_id, round=round, parent="v0", variant=variant, candidate=cid,
                                          digest=harness.digest, operations=cand.operations,
                                          harness=harness.spec(), clusters=clusters))

    def judged(self, round: int, concern: str, banned: tuple[str, ...]) -> None:
        """Record a critic's verdict with a strategy concern."""
        self.records.append(CriticJudged(run_id=self.run_id, round=round, strategy_concern=concern, banned=banned))


def write_ledger(url: str, run: LedgerRun) -> None:
    """Write a hand-made run's ledger onto the server at ``url``, through the ledger aggregate the loop appends with."""
    async def write() -> None:
        async with connect(NatsSettings(url=url)) as conn:
            ledger = Ledger(conn, run.run_id)
            try:
                await ledger.start(run.records[0])  # type: ignore[arg-type]
                await ledger.append(*run.records[1:])
            finally:
                await ledger.close()
    asyncio.run(write())
