"""The one fold of a run's ledger (``projections.ledger``): what it holds, what it refuses, and its checkpoint."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest
from ledger_run import LedgerRun, attach, task

from hx.aegis.errors import LedgerError
from hx.aegis.ledger import EvolutionLedger
from hx.aegis.state import RunState
from hx.replay.errors import LedgerRefused
from projections.ledger import RunLedger
from projections.ledger_reader import EditLedger
from schemas.envelope import Record, encode_body
from schemas.harness import HarnessSpec
from schemas.landscape import Landscape
from schemas.ledger import (
    LEDGER_EVENTS,
    ApprovalGiven,
    ApprovalRequested,
    CandidateRevised,
    EvolutionFinished,
    GateCheck,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    LedgerOpened,
    RoundDecided,
    VariantRetired,
    chained,
    ledger_digest,
)
from schemas.lifecycle import AttemptFinished
from streams.edit_ledger import ledger_filter
from streams.signing import LedgerKey, verify


def chain(events: list[LedgerEvent]) -> list[LedgerEvent]:
    """The events chained as the ledger aggregate chains them."""
    out: list[LedgerEvent] = []
    for e in events:
        out.append(chained(e, ledger_digest(out[-1]) if out else ""))
    return out


def shipped_run() -> LedgerRun:
    """A run that records every kind of ledger event: proposes, revises, gates and ships, forks and retires."""
    run = LedgerRun()
    run.model_changed(0, "policy:abc")
    run.digested(0, [task("b:g:dev:1", passes=1), task("b:g:dev:2"), task("b:h:dev:1")])
    run.records.append(LandscapePlanned(run_id=run.run_id, round=0, landscape=Landscape()))
    run.proposed(0, "C-R0-01", (attach("action_pruner"),), flips=("b:g:dev:2",))
    run.proposed(0, "C-R0-02", (attach("task_objects"),), flips=("b:h:dev:1",))
    first = run.state.candidates["C-R0-01"].proposal
    run.records.append(CandidateRevised(run_id=run.run_id, round=0, candidate="C-R0-01", reason="r",
                                        operations=first.operations, manifest=first.manifest, digest=first.digest))
    run.judged(0, "", ())
    run.records.append(ApprovalRequested(run_id=run.run_id, round=0, candidate="C-R0-01", risk=0.9, reason="r"))
    run.records.append(ApprovalGiven(run_id=run.run_id, candidate="C-R0-01", approved=True))
    run.records.append(GateJudged(run_id=run.run_id, round=0, candidate="C-R0-01", variant="v0", passed=True,
                                  outcome="ship", checks=tuple(GateCheck(name=n, passed=True) for n in (
                                      "manifest", "config", "smoke", "leakage", "counterfactual", "seesaw",
                                      "effect"))))
    run.shipped(0, "C-R0-01")
    run.forked(0, "C-R0-02", "v1", ("b:h",))
    run.records.append(VariantRetired(run_id=run.run_id, round=0, variant="v1", reason="r"))
    run.records.append(HeldoutScored(run_id=run.run_id, round=0, trace_round=0, heldout_digest="", tasks=0))
    run.records.append(RoundDecided(run_id=run.run_id, round=0, outcome="shipped", shipped=("C-R0-01",)))
    run.records.append(EvolutionFinished(run_id=run.run_id, rounds=1))
    return run


def test_the_fold_holds_variants_versions_candidates_and_ships() -> None:
    run = shipped_run()
    ledger = RunLedger.of(chain(run.records))
    assert not ledger.faults and ledger.finished is not None and ledger.next_round == 1
    v0 = ledger.variants["v0"]
    assert [v.kind for v in v0.versions] == ["opened", "ship"] and v0.versions[1].candidates == ["C-R0-01"]
    assert v0.versions[1].base == v0.versions[0].digest
    assert ledger.as_of(0)["v0"] is v0.versions[0] and ledger.as_of(1)["v0"] is v0.versions[1]
    cand = ledger.candidates["C-R0-01"]
    assert cand.gate is not None and cand.shipped_position == ledger.shipments[0].position
    assert cand.revision is not None and cand.approval is True and not cand.waiting
    assert [s.candidate for s in ledger.ships] == ["C-R0-01", "C-R0-02"] and ledger.shipped() == {"C-R0-01", "C-R0-02"}
    assert ledger.variants["v1"].retired and ledger.routing == {} and ledger.model == "policy:abc"
    # The loop's view is this fold with the harnesses built: the same digests.
    state = RunState.of(run.records)
    assert state.variants["v0"].harness.digest == v0.current.digest


@pytest.mark.parametrize("case", ["not opened first", "second opened", "after finished", "unknown candidate",
                                  "unknown variant", "another run"])
def test_an_event_that_makes_no_sense_where_it_stands_is_a_fault_not_applied(case: str) -> None:
    run = shipped_run()
    records = list(run.records)
    opened = records[0]
    assert isinstance(opened, LedgerOpened)
    gate = next(r for r in records if isinstance(r, GateJudged))
    if case == "not opened first":
        records = records[1:]
        want = "a run's ledger starts with ledger.opened"
    elif case == "second opened":
        records.insert(2, opened)
        want = "a second ledger.opened"
    elif case == "after finished":
        records.append(msgspec.structs.replace(gate, candidate="C-R0-01"))
        want = "follows ledger.evolution_finished"
    elif case == "unknown candidate":
        records.insert(-2, msgspec.structs.replace(gate, candidate="C-R9-99"))
        want = "names candidate C-R9-99, which no earlier candidate_proposed proposed"
    elif case == "unknown variant":
        ship = next(r for r in records if isinstance(r, HarnessShipped))
        records.insert(-2, msgspec.structs.replace(ship, variant="v7"))
        want = "edits variant 'v7', which is not in the pool"
    else:
        records.insert(-2, msgspec.structs.replace(gate, run_id="someone-else"))
        want = "belongs to run 'someone-else', not 'ledger-run'"
    ledger = RunLedger.of(chain(records))
    fault = ledger.first_fault
    assert fault is not None and want in str(fault), ledger.faults
    with pytest.raises(LedgerRefused, match="does not fold"):
        RunState.of(records)


def test_positions_repeated_or_skipped_and_foreign_events_are_faults() -> None:
    records = chain(shipped_run().records)
    ledger = RunLedger(run_id="ledger-run")
    for position, event in enumerate(records[:3], 1):
        ledger.fold(event, position, position)
    ledger.fold(records[2], 3, 40)  # published again on the subject of event 3
    ledger.foreign(4, 41, AttemptFinished.TYPE, "not a ledger event")
    ledger.fold(records[3], 6, 42)  # event 5 never arrives
    kinds = [(f.position, f.kind) for f in ledger.faults]
    assert kinds == [(3, "duplicate"), (4, "structure"), (6, "dropped")], ledger.faults
    assert "written again on the subject of event 3" in str(ledger.faults[0])


@pytest.mark.parametrize("kind", [cls for cls in LEDGER_EVENTS if cls is not LedgerOpened])
def test_a_broken_prev_is_refused_by_the_aggregate_and_named_by_the_fold_for_every_event_type(
        kind: type[LedgerEvent]) -> None:
    """Every ledger event type: one whose ``prev`` is not the head does not load, and the fold names it."""
    records = chain(shipped_run().records)
    at = next(i for i, r in enumerate(records) if type(r) is kind)
    broken = msgspec.structs.replace(records[at], prev="sha256:" + "0" * 64)
    aggregate = EvolutionLedger(records[0])  # type: ignore[arg-type]
    for r in records[1:at]:
        aggregate.fold(r)
    with pytest.raises(LedgerError, match="chains to"):
        aggregate.fold(broken)
    ledger = RunLedger.of([*records[:at], broken, *records[at + 1:]])
    fault = ledger.first_fault
    assert fault is not None and (fault.position, fault.kind) == (at + 1, "chain")


def test_old_events_digest_to_the_bytes_they_were_chained_by() -> None:
    """An event of schema version 1 (no ``signature``; ``ledger.opened`` without ``public_key``) keeps its digest."""
    class OpenedV1(msgspec.Struct, kw_only=True):
        run_id: str
        prev: str = ""
        strategy: str
        harness: dict[str, Any]
        digest: str
        variant: str = "v0"
        settings: dict[str, Any] = {}
        heldout_digest: str = ""

    params = {"b": 1, "a": {"z": [1.5, 2], "c": "x"}}
    harness = {"processors": [{"type": "t", "hooks": ["task_start"], "params": params}], "slots": {"workspace": "w"}}
    old = msgspec.msgpack.Encoder(order="deterministic").encode(OpenedV1(run_id="r", strategy="global",
                                                                         harness=harness, digest="d"))
    now = LedgerOpened(run_id="r", strategy="global", harness=msgspec.convert(harness, HarnessSpec), digest="d")
    assert ledger_digest(now) == "sha256:" + hashlib.sha256(b"ledger.opened\0" + old).hexdigest()
    assert msgspec.msgpack.decode(old, type=LedgerOpened) == now  # and its body reads as the current version


def test_a_signature_signs_the_digest_and_is_left_out_of_it() -> None:
    key = LedgerKey.generate()
    opened = LedgerOpened(run_id="r", strategy="global", harness=HarnessSpec(), digest="d", public_key=key.public_key)
    signed = msgspec.structs.replace(opened, signature=key.sign(ledger_digest(opened)))
    assert ledger_digest(signed) == ledger_digest(opened)
    assert verify(key.public_key, ledger_digest(signed), signed.signature) == ""
    edited = msgspec.structs.replace(signed, strategy="ensemble")
    assert "does not verify" in verify(key.public_key, ledger_digest(edited), edited.signature)
    other = LedgerKey.generate()
    assert "does not verify" in verify(other.public_key, ledger_digest(signed), signed.signature)


def test_the_projection_checkpoint_folds_back_to_the_same_state() -> None:
    records = chain(shipped_run().records)
    projection = EditLedger()
    state = projection.initial()
    subject = ledger_filter("ledger-run")[:-1]
    for position, event in enumerate(records, 1):
        projection.fold(state, Record(position, 0, f"{subject}{position}", type(event).TYPE, 2, 0, event))
    projection.fold(state, Record(99, 0, f"{subject}{len(records) + 1}", AttemptFinished.TYPE, 1, 0, AttemptFinished(
        run_id="ledger-run", round=0, task_id="t", attempt=0, passed=True)))
    restored = projection.decode(projection.encode(state))
    assert projection.digest(restored) == projection.digest(state)
    assert restored["ledger-run"].faults == state["ledger-run"].faults and state["ledger-run"].faults
    assert projection.encode(restored) == projection.encode(state)
    assert restored["ledger-run"].as_of(1)["v0"].digest == state["ledger-run"].as_of(1)["v0"].digest
    assert encode_body(records[0]) == encode_body(restored["ledger-run"].entries[0].event)
