"""Routing (``RunLedger.route``, ``hx.aegis.variants.route``): a cluster a variant serves runs under it; every
other cluster runs under the live variant with the best overall success (the share of its tasks solved in the
latest round it ran), the root until a round has run; on runs written record by record."""

from __future__ import annotations

from ledger_run import LedgerRun, attach, task

from hx.aegis.variants import route, weakest
from hx.replay.scoreboard import report
from schemas.ledger import VariantRetired


def two_variants() -> LedgerRun:
    """v0 and its fork v1, which serves ``twx:a``; round 1: v1 solves 2 of 2 of its tasks, v0 1 of 4 of its."""
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    run.forked(0, "C-R0-01", "v1", ("twx:a",))
    run.digested(1, [task("twx:a:1", variant="v1", passes=1), task("twx:a:2", variant="v1", passes=2),
                     task("twx:b:1", passes=1), task("twx:b:2"), task("twx:c:1"), task("twx:c:2")])
    return run


def test_an_unserved_cluster_runs_under_the_variant_with_the_best_success_not_the_root() -> None:
    run = two_variants()
    state = run.state
    assert state.ledger.success() == {"v1": 1.0, "v0": 0.25}
    assert (state.route("twx:a"), state.route("twx:b"), state.route("twx:d")) == ("v1", "v1", "v1")
    # the held-out play and the rollouts group their tasks by this route
    assert route(state, ["twx:b:7", "twx:a:7", "twx:d:1"]) == {"v1": ["twx:b:7", "twx:a:7", "twx:d:1"]}
    assert report(state.ledger, {}).unserved == "v1"


def test_a_variant_is_judged_by_the_latest_round_it_ran() -> None:
    run = two_variants()
    # round 2: v1 ran everything (it was the best) and solved 1 of 4; v0 ran nothing: its round 1 stands (1 of 4)
    run.digested(2, [task("twx:a:1", variant="v1", passes=1), task("twx:b:1", variant="v1"),
                     task("twx:c:1", variant="v1"), task("twx:c:2", variant="v1")])
    assert run.state.ledger.success() == {"v1": 0.25, "v0": 0.25}
    assert run.state.route("twx:b") == "v0"  # a tie goes to the variant made first
    run.digested(3, [task("twx:a:1", variant="v1", passes=2), task("twx:b:1"), task("twx:c:1")])
    assert run.state.ledger.success() == {"v1": 1.0, "v0": 0.0}
    assert run.state.route("twx:b") == "v1"


def test_the_root_runs_unserved_clusters_until_a_round_has_run_and_after_the_best_retires() -> None:
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    run.forked(0, "C-R0-01", "v1", ("twx:a",))
    assert run.state.ledger.success() == {}
    assert (run.state.route("twx:a"), run.state.route("twx:b")) == ("v1", "v0")
    run = two_variants()
    run.records.append(VariantRetired(run_id=run.run_id, round=1, variant="v1", reason="test"))
    assert run.state.route("twx:a") == run.state.route("twx:b") == "v0"


def test_the_variant_running_unserved_clusters_is_not_retired_as_idle() -> None:
    run = two_variants()
    run.proposed(1, "C-R1-01", (attach("visited_states"),))
    run.forked(1, "C-R1-01", "v2", ("twx:a",))  # v2 takes twx:a over: v1 serves no cluster of its own
    latest = list(run.state.digests[1])
    assert run.state.ledger.unserved() == "v1"
    assert weakest(run.state, latest) == "v2"  # not v1, which runs every unserved cluster
