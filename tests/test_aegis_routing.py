"""Routing (``RunLedger.route``, ``hx.aegis.variants.route``): a cluster a variant serves runs under it; any other
cluster runs under the live variant with the best success on the cluster's own tasks, else (a cluster not run yet)
the best overall success (the share of its tasks solved in the latest round it ran), the root until a round has
run; on runs written record by record."""

from __future__ import annotations

from ledger_run import LedgerRun, attach, task

from hx.aegis.variants import route, weakest
from hx.replay.scoreboard import report
from hx.report.export import index
from hx.report.export_fold import RunFold
from schemas.ledger import VariantRetired


def two_variants() -> LedgerRun:
    """v0 and its fork v1, which serves ``twx:a``; round 1: v1 solves 2 of 2 of its tasks, v0 1 of 4 of its."""
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    run.forked(0, "C-R0-01", "v1", ("twx:a",))
    run.digested(1, [task("twx:a:1", variant="v1", passes=1), task("twx:a:2", variant="v1", passes=2),
                     task("twx:b:1", passes=1), task("twx:b:2"), task("twx:c:1"), task("twx:c:2")])
    return run


def test_a_cluster_not_run_yet_goes_to_the_variant_with_the_best_overall_success_not_the_root() -> None:
    run = two_variants()
    state = run.state
    assert state.ledger.success() == {"v1": 1.0, "v0": 0.25}
    assert (state.route("twx:a"), state.route("twx:d")) == ("v1", "v1")
    # the held-out play and the rollouts group their tasks by this route
    assert route(state, ["twx:d:1", "twx:a:7", "twx:b:7"]) == {"v0": ["twx:b:7"], "v1": ["twx:d:1", "twx:a:7"]}
    summary = report(state.ledger, {})
    assert summary.unserved == "v1" and summary.routing == {"twx:a": "v1", "twx:b": "v0", "twx:c": "v0"}
    assert "| (a cluster not run yet) | v1 |" in index(RunFold.of(run.records), {}, {})


def test_a_cluster_a_variant_has_been_playing_stays_with_it_unless_another_did_better_on_it() -> None:
    run = two_variants()
    # v0 solved 1 of 2 of twx:b: that, not v1's 2 of 2 on twx:a, is the evidence about twx:b
    assert run.state.ledger.success("twx:b") == {"v0": 0.5}
    assert (run.state.route("twx:b"), run.state.route("twx:c")) == ("v0", "v0")
    run.proposed(1, "C-R1-01", (attach("visited_states"),))
    run.forked(1, "C-R1-01", "v2", ("twx:b",))
    run.digested(2, [task("twx:b:1", variant="v2", passes=2), task("twx:b:2", variant="v2", passes=1),
                     task("twx:c:1")])
    run.records.append(VariantRetired(run_id=run.run_id, round=2, variant="v2", reason="test"))
    # twx:b is unserved again: v0's round 1 (1 of 2) is the only live evidence on it, whatever v1 did elsewhere
    assert run.state.route("twx:b") == "v0"


def test_the_latest_round_a_variant_ran_counts_and_a_tie_goes_to_the_variant_made_first() -> None:
    run = two_variants()
    # round 2: v1 solves 1 of 4 (twx:a); v0 ran nothing: its round 1 stands (1 of 4)
    run.digested(2, [task("twx:a:1", variant="v1", passes=1), task("twx:a:2", variant="v1"),
                     task("twx:a:3", variant="v1"), task("twx:a:4", variant="v1")])
    assert run.state.ledger.success() == {"v1": 0.25, "v0": 0.25}
    assert run.state.route("twx:d") == "v0"
    run.digested(3, [task("twx:a:1", variant="v1", passes=2), task("twx:b:1"), task("twx:c:1")])
    assert run.state.ledger.success() == {"v1": 1.0, "v0": 0.0}
    assert run.state.route("twx:d") == "v1"


def test_the_root_runs_unserved_clusters_until_a_round_has_run_and_after_the_best_retires() -> None:
    run = LedgerRun()
    run.proposed(0, "C-R0-01", (attach("undo_guard"),))
    run.forked(0, "C-R0-01", "v1", ("twx:a",))
    assert run.state.ledger.success() == {}
    assert (run.state.route("twx:a"), run.state.route("twx:b")) == ("v1", "v0")
    run = two_variants()
    run.records.append(VariantRetired(run_id=run.run_id, round=1, variant="v1", reason="test"))
    assert run.state.route("twx:a") == run.state.route("twx:d") == "v0"


def test_the_variant_a_new_cluster_would_get_is_not_retired_as_idle() -> None:
    run = two_variants()
    run.proposed(1, "C-R1-01", (attach("visited_states"),))
    run.forked(1, "C-R1-01", "v2", ("twx:a",))  # v2 takes twx:a over: no cluster routes to v1
    latest = list(run.state.digests[1])
    assert run.state.ledger.unserved() == "v1"
    assert weakest(run.state, latest) == "v2"  # not v1, which a cluster not run yet would run under
