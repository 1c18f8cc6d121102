"""Shipping (``hx.aegis.shipping``): passing candidates shipped together or the first alone, approvals
shipped later, and a fork into a full pool of variants retiring one first; the ledger records and the
state folded from them say what happened, on runs written record by record."""

from __future__ import annotations

import asyncio
from typing import Literal

from ledger_run import LedgerRun, attach, task

from hx.aegis.shipping import fork, ship, ship_approved
from hx.aegis.state import RunState
from hx.gate.rule import Verdict
from schemas.landscape import TaskDigest
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    GateJudged,
    HarnessShipped,
    LedgerEvent,
    VariantForked,
    VariantRetired,
)


class Ledger:
    """A ``LedgerRun`` as shipping sees a run: its id, its folded state, and an append."""

    def __init__(self, run: LedgerRun) -> None:
        self.ledger = run
        self.run_id = run.run_id

    def state(self) -> RunState:
        """The state the records so far fold into."""
        return self.ledger.state

    async def append(self, *events: LedgerEvent) -> None:
        """Record the events."""
        self.ledger.records.extend(events)


def pool_of_three() -> LedgerRun:
    """v0 (the root) with two forks: v1 serves ``twx:a``, v2 serves ``twx:b``; one more candidate waits on v0."""
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    run.forked(0, "C-R0-01", "v1", ("twx:a",))
    run.proposed(0, "C-R0-02", (attach("explore_untried"),))
    run.forked(0, "C-R0-02", "v2", ("twx:b",))
    run.proposed(1, "C-R1-01", (attach("task_notes"),))
    return run


def fork_c_r1_01(run: LedgerRun, max_variants: int, latest: list[TaskDigest]) -> list[LedgerEvent]:
    """Fork the waiting candidate for ``twx:c`` and return the records it appended."""
    before = len(run.records)
    cand = run.state.candidates["C-R1-01"].proposal
    verdict = Verdict(outcome="fork", clusters=("twx:c",))
    asyncio.run(fork(Ledger(run), 1, cand, verdict, run.state, max_variants=max_variants, digests={"v": latest}))
    return run.records[before:]


def test_a_fork_into_a_full_pool_retires_the_variant_that_solves_least_first() -> None:
    run = pool_of_three()
    latest = [task("twx:a:1", variant="v1"), task("twx:a:2", variant="v1", passes=1),
              task("twx:b:1", variant="v2", passes=2), task("twx:b:2", variant="v2", passes=1), task("twx:c:1")]
    retired, forked = fork_c_r1_01(run, 3, latest)
    assert isinstance(retired, VariantRetired) and retired.variant == "v1"  # 1 of 2 solved, against v2's 2 of 2
    assert "3 variants" in retired.reason
    assert isinstance(forked, VariantForked)
    assert (forked.parent, forked.variant, forked.clusters, forked.candidate) == ("v0", "v3", ("twx:c",), "C-R1-01")
    state = run.state
    assert sorted(state.live()) == ["v0", "v2", "v3"]
    assert state.route("twx:a") == "v0"  # the retired variant's tasks go back to the root
    assert (state.route("twx:b"), state.route("twx:c")) == ("v2", "v3")
    assert forked.digest == state.variants["v3"].harness.digest
    assert "task_notes" in {a.type for a in state.variants["v3"].harness.attachments}


def test_a_variant_that_serves_no_cluster_is_retired_before_a_weaker_one_that_serves() -> None:
    run = pool_of_three()
    run.proposed(1, "C-R1-02", (attach("visited_states"),))
    run.forked(1, "C-R1-02", "v3", ("twx:b",))  # v3 takes twx:b over: v2 now serves nothing
    latest = [task("twx:a:1", variant="v1"), task("twx:b:1", variant="v3"), task("twx:b:2", variant="v2", passes=2)]
    retired, forked = fork_c_r1_01(run, 4, latest)
    assert isinstance(retired, VariantRetired) and retired.variant == "v2"
    assert isinstance(forked, VariantForked) and forked.variant == "v4"
    assert sorted(run.state.live()) == ["v0", "v1", "v3", "v4"]


def test_a_pool_that_holds_only_the_root_is_never_emptied_and_the_fork_is_dropped() -> None:
    run = LedgerRun()
    run.proposed(1, "C-R1-01", (attach("task_notes"),))
    assert fork_c_r1_01(run, 1, [task("twx:c:1")]) == []
    assert list(run.state.live()) == ["v0"]


def test_a_fork_with_room_in_the_pool_retires_nothing() -> None:
    run = pool_of_three()
    (forked,) = fork_c_r1_01(run, 4, [task("twx:c:1")])
    assert isinstance(forked, VariantForked) and forked.variant == "v3"
    assert sorted(run.state.live()) == ["v0", "v1", "v2", "v3"]


def attached(run: LedgerRun, variant: str = "v0") -> set[str]:
    """The processor types a variant's harness holds."""
    return {a.type for a in run.state.variants[variant].harness.attachments}


def test_candidates_that_compose_ship_together_in_one_record() -> None:
    run = LedgerRun()
    cands = [run.proposed(0, "C-R0-01", (attach("undo_guard"),)), run.proposed(0, "C-R0-02", (attach("task_notes"),))]
    before = run.state.variants["v0"].harness.digest
    asyncio.run(ship(Ledger(run), 0, "v0", cands))
    (shipped,) = run.records[-1:]
    assert isinstance(shipped, HarnessShipped)
    assert shipped.candidates == ("C-R0-01", "C-R0-02") and shipped.digest_before == before
    assert {"undo_guard", "task_notes"} <= attached(run)
    assert [s.candidate for s in run.state.ships] == ["C-R0-01", "C-R0-02"]


def test_candidates_that_clash_together_ship_the_first_alone() -> None:
    run = LedgerRun()
    # each passes alone; together they attach one singleton group twice
    cands = [run.proposed(0, "C-R0-01", (attach("undo_guard"),)),
             run.proposed(0, "C-R0-02", (attach("undo_guard"), attach("task_notes")))]
    asyncio.run(ship(Ledger(run), 0, "v0", cands))
    shipped = run.records[-1]
    assert isinstance(shipped, HarnessShipped) and shipped.candidates == ("C-R0-01",)
    assert "undo_guard" in attached(run) and "task_notes" not in attached(run)


def waiting(run: LedgerRun, cid: str, outcome: Literal["ship", "fork"] = "ship",
            clusters: tuple[str, ...] = ()) -> None:
    """Record a passing verdict on ``cid`` that waits for a human."""
    cand = run.state.candidates[cid].proposal
    run.records += [GateJudged(run_id=run.run_id, round=cand.round, candidate=cid, variant=cand.variant, passed=True,
                               checks=(), outcome=outcome, clusters=clusters),
                    ApprovalRequested(run_id=run.run_id, round=cand.round, candidate=cid, risk=0.9,
                                      reason="risky")]


def answered(run: LedgerRun, cid: str, approved: bool) -> None:
    """Record a human's answer."""
    run.records.append(ApprovalGiven(run_id=run.run_id, candidate=cid, approved=approved))


def two_answered(second: bool) -> LedgerRun:
    """Two candidates judged on v0's starter harness, both waiting for a human: the first approved, the second
    as told; then the approvals shipped in round 2."""
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    run.proposed(0, "C-R0-02", (attach("task_notes"),))
    waiting(run, "C-R0-01")
    waiting(run, "C-R0-02")
    answered(run, "C-R0-01", True)
    answered(run, "C-R0-02", second)
    asyncio.run(ship_approved(Ledger(run), 2, max_variants=3, digests={}))
    return run


def test_an_approved_candidate_ships_in_a_later_round_and_a_refused_one_does_not() -> None:
    run = two_answered(False)
    shipped = [r for r in run.records if isinstance(r, HarnessShipped)]
    assert [(s.round, s.candidates) for s in shipped] == [(2, ("C-R0-01",))]
    assert "task_notes" not in attached(run)
    assert run.state.pending() == []


def test_an_approval_for_a_harness_that_has_changed_since_is_not_shipped() -> None:
    run = two_answered(True)  # both judged on one harness: once the first ships, the second's base is gone
    shipped = [r.candidates for r in run.records if isinstance(r, HarnessShipped)]
    assert shipped == [("C-R0-01",)]
    assert "task_notes" not in attached(run)


def test_an_approved_fork_becomes_a_variant() -> None:
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    waiting(run, "C-R0-01", outcome="fork", clusters=("twx:a",))
    answered(run, "C-R0-01", True)
    asyncio.run(ship_approved(Ledger(run), 1, max_variants=3, digests={}))
    forked = run.records[-1]
    assert isinstance(forked, VariantForked) and (forked.variant, forked.clusters) == ("v1", ("twx:a",))
    assert run.state.route("twx:a") == "v1" and "undo_guard" in attached(run, "v1")
