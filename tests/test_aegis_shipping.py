"""Shipping (``hx.aegis.shipping``): a fork into a full pool of variants retires one first, and the
ledger records and the state folded from it say which, on runs written record by record."""

from __future__ import annotations

import asyncio

from ledger_run import LedgerRun

from hx.aegis.gate import Verdict
from hx.aegis.shipping import fork
from hx.aegis.state import RunState
from hx.harness.processor import processor_type
from schemas.edits import Attach
from schemas.landscape import TaskDigest
from schemas.ledger import LedgerEvent, VariantForked, VariantRetired


def attach(name: str) -> Attach:
    """Attach a library processor at every hook it serves."""
    return Attach(processor=name, hooks=processor_type(name).accepted_hooks())


def digest(task: str, variant: str, passes: int) -> TaskDigest:
    """One task's digest of two attempts."""
    return TaskDigest(task=task, cluster=":".join(task.split(":")[:2]), variant=variant, attempts=2, passes=passes,
                      category="" if passes else "no_progress")


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
    latest = [digest("twx:a:1", "v1", 0), digest("twx:a:2", "v1", 1), digest("twx:b:1", "v2", 2),
              digest("twx:b:2", "v2", 1), digest("twx:c:1", "v0", 0)]
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
    latest = [digest("twx:a:1", "v1", 0), digest("twx:b:1", "v3", 0), digest("twx:b:2", "v2", 2)]
    retired, forked = fork_c_r1_01(run, 4, latest)
    assert isinstance(retired, VariantRetired) and retired.variant == "v2"
    assert isinstance(forked, VariantForked) and forked.variant == "v4"
    assert sorted(run.state.live()) == ["v0", "v1", "v3", "v4"]


def test_a_pool_that_holds_only_the_root_is_never_emptied_and_the_fork_is_dropped() -> None:
    run = LedgerRun()
    run.proposed(1, "C-R1-01", (attach("task_notes"),))
    assert fork_c_r1_01(run, 1, [digest("twx:c:1", "v0", 0)]) == []
    assert list(run.state.live()) == ["v0"]


def test_a_fork_with_room_in_the_pool_retires_nothing() -> None:
    run = pool_of_three()
    (forked,) = fork_c_r1_01(run, 4, [digest("twx:c:1", "v0", 0)])
    assert isinstance(forked, VariantForked) and forked.variant == "v3"
    assert sorted(run.state.live()) == ["v0", "v1", "v2", "v3"]
