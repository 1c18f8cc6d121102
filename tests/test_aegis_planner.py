"""The Planner and the levers on their own: the landscape a round's digests and the run's ledger make
(regressions first, failure groups, tried and untried buckets, the critic's concern and bans), and each
lever's record (proposals, ships, predicted and realised flips, hit rates, reputation)."""

from __future__ import annotations

import msgspec
import pytest
from ledger_run import LedgerRun, attach, task

from hx.aegis import levers
from hx.aegis.operations import bucket_of
from hx.aegis.planner import DIMENSIONS, failure_groups, plan
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.processor import processor_type, registered
from hx.harnesses import starter_harness
from schemas.edits import BUCKETS, AnyEditOp, Remove, Reparam
from schemas.landscape import FAILURE_CATEGORIES, FailureGroup, Lever, Regression

RUN = "plan-run"
BASE = starter_harness("textworld")


class Run(LedgerRun):
    """A run of this module's tests."""

    def __init__(self, harness: HarnessConfig = BASE) -> None:
        super().__init__(harness, RUN)


def with_record(lever: Lever, proposed: int, predicted: int, realised: int) -> Lever:
    """``lever`` with another record on the run."""
    return msgspec.structs.replace(lever, proposed=proposed, predicted=predicted, realised=realised)


# --- the landscape ---------------------------------------------------------------------------------


def test_a_regression_is_a_task_solved_last_round_and_not_this_one() -> None:
    """Solved -> failing is a regression; failing -> failing, a new task, and failing -> solved are not."""
    run = Run()
    run.digested(0, [task("b:g:dev:1", passes=2), task("b:g:dev:2"), task("b:g:dev:3"), task("b:g:dev:5", passes=1)])
    now = [task("b:g:dev:1"), task("b:g:dev:2"), task("b:g:dev:3", passes=1), task("b:g:dev:4"),
           task("b:g:dev:5", passes=2)]
    assert run.state.regressions(1, now) == (Regression(task="b:g:dev:1", variant="v0", since_round=0),)


def test_a_regressions_suspects_are_last_rounds_ships_to_its_own_variant() -> None:
    """Only ships of the previous round, and only to the variant the task runs under, are suspects."""
    run = Run()
    run.digested(0, [task("a:x:dev:1"), task("a:y:dev:1")])
    run.ship(0, "C-R0-01", (attach("visited_states"),), ["a:x:dev:1"])
    run.proposed(1, "C-R1-01", (attach("explore_untried"),), ["a:x:dev:1"])
    run.forked(1, "C-R1-01", "v1", ("a:y",))
    run.ship(1, "C-R1-02", (attach("undo_guard"),), ["a:x:dev:1"])
    run.digested(1, [task("a:x:dev:1", passes=1), task("a:y:dev:1", passes=1, variant="v1")])
    now = [task("a:x:dev:1"), task("a:y:dev:1", variant="v1")]
    got = {r.task: r for r in run.state.regressions(2, now)}
    assert got["a:x:dev:1"].suspects == ("C-R1-02",)  # not C-R0-01 (older) nor the fork (another variant)
    assert got["a:y:dev:1"].suspects == ("C-R1-01",) and got["a:y:dev:1"].variant == "v1"
    assert all(r.since_round == 1 for r in got.values())


def test_failures_are_grouped_by_category_largest_first() -> None:
    """Failing tasks grouped per category, biggest group first (ties by name), solved tasks left out."""
    digests = [task("b:g:dev:1", category="loop", implicated=("loop_detector",)),
               task("b:g:dev:2", category="stagnation", implicated=("history_window",)),
               task("b:g:dev:3", category="loop", implicated=("history_window", "loop_detector")),
               task("b:g:dev:4", category="invalid_action"),
               task("b:g:dev:5", passes=1),
               task("b:g:dev:6", category="loop")]
    assert failure_groups(digests) == (
        FailureGroup(category="loop", tasks=("b:g:dev:1", "b:g:dev:3", "b:g:dev:6"),
                     implicated=("loop_detector", "history_window")),
        FailureGroup(category="invalid_action", tasks=("b:g:dev:4",)),
        FailureGroup(category="stagnation", tasks=("b:g:dev:2",), implicated=("history_window",)),
    )


def test_a_round_with_nothing_failing_has_an_empty_landscape() -> None:
    """All solved and nothing regressed: the landscape is empty and the round ends there."""
    run = Run()
    run.digested(0, [task("b:g:dev:1", passes=1)])
    assert plan(run.state, 1, [task("b:g:dev:1", passes=2), task("b:g:dev:2", passes=1)]).empty
    assert not plan(run.state, 1, [task("b:g:dev:1")]).empty  # a regression alone is something to act on
    assert not plan(run.state, 1, [task("b:g:dev:1", passes=1), task("b:g:dev:9", category="loop")]).empty


def test_the_landscape_says_which_buckets_and_dimensions_were_tried() -> None:
    """Buckets and dimensions of every candidate so far are tried, the rest untried, each in canonical order."""
    run = Run()
    digests = run.digested(0, [task("b:g:dev:1", category="loop")])
    assert plan(run.state, 0, digests).untried_buckets == BUCKETS
    assert plan(run.state, 0, digests).untried_dimensions == DIMENSIONS
    run.proposed(0, "C-R0-01", (attach("task_notes"),))
    run.proposed(0, "C-R0-02", (Reparam(group="loop_detector", params={"interrupt_after": 20}),))
    land = plan(run.state, 1, digests)
    assert land.tried_buckets == ("prompt", "config")
    assert land.untried_buckets == ("tools", "processor")
    dims = {processor_type("task_notes").dimension, processor_type("loop_detector").dimension}
    assert land.tried_dimensions == tuple(d for d in DIMENSIONS if d in dims)
    assert set(land.untried_dimensions) == set(DIMENSIONS) - dims


def test_the_landscape_lists_every_catalog_lever_and_every_lever_pulled() -> None:
    """The levers: the catalog in order, then the edits candidates made that are not in it (remove, reparam)."""
    run = Run()
    run.proposed(0, "C-R0-01", (Remove(group="budget"),))
    run.proposed(0, "C-R0-02", (Reparam(group="loop_detector", params={"warn_after": 4}), attach("task_objects")))
    land = plan(run.state, 1, [task("b:g:dev:1")])
    names = [lv.name for lv in land.levers]
    assert names == [*levers.catalog(), "remove:budget", "reparam:loop_detector"]
    by = {lv.name: lv for lv in land.levers}
    assert by["task_objects"].proposed == 1 and by["loop_detector"].proposed == 0
    assert by["remove:budget"].bucket == "processor" and by["reparam:loop_detector"].bucket == "config"


def test_a_strategy_concern_and_its_bans_hold_for_the_next_round_only() -> None:
    """The critic of round t speaks to the planner of round t + 1; the round after, the concern and ban are gone."""
    run = Run()
    run.judged(2, "the last 3 ships all edit the processor bucket", ("visited_states",))
    digests = [task("b:g:dev:1", category="loop")]
    nxt = plan(run.state, 3, digests)
    assert nxt.concern.startswith("the last 3 ships") and nxt.banned == ("visited_states",)
    assert {lv.name for lv in nxt.levers if lv.banned} == {"visited_states"}
    for later in (2, 4):
        land = plan(run.state, later, digests)
        assert (land.concern, land.banned) == ("", ())
        assert not any(lv.banned for lv in land.levers)


# --- levers --------------------------------------------------------------------------------------


def test_the_catalog_holds_the_processors_that_declare_what_they_address() -> None:
    """Every lever addresses taxonomy categories; processors with no claim (budget, the prompt) are no levers."""
    full, standalone = levers.catalog(), levers.catalog(standalone=True)
    assert full and set(standalone) < set(full)
    for name, cls in full.items():
        assert registered()[name] is cls
        assert cls.addresses and set(cls.addresses) <= set(FAILURE_CATEGORIES)
    for name in ("budget", "history_window", "system_prompt_template", "observation_trim"):
        assert not processor_type(name).addresses and name not in full
    for name in full.keys() - standalone.keys():
        assert not full[name].standalone  # e.g. an allow-list with nothing in it yet
    assert "tool_filter" in full and "tool_filter" not in standalone
    assert "loop_detector" in standalone


def test_every_standalone_lever_attaches_to_a_bare_harness_with_its_defaults() -> None:
    """A standalone lever needs no configuration: attached at its hooks with default parameters, it builds."""
    for name in levers.catalog(standalone=True):
        harness = apply(HarnessConfig(), (attach(name),))
        assert harness.groups() == (processor_type(name).group(),)


def test_a_levers_record_counts_proposals_ships_and_realised_predictions() -> None:
    """Proposed, shipped, predicted (flips on tasks the next round evaluated) and realised (those that passed)."""
    run = Run()
    run.digested(0, [task(f"b:g:dev:{i}", category="loop") for i in range(1, 5)])
    run.proposed(0, "C-R0-01", (attach("visited_states"),), ["b:g:dev:1", "b:g:dev:2", "b:g:dev:3", "b:g:dev:99"])
    run.proposed(0, "C-R0-02", (attach("visited_states"), attach("undo_guard")), ["b:g:dev:4"])
    run.shipped(0, "C-R0-01")
    before = {lv.name: lv for lv in levers.records(run.state, ["visited_states", "undo_guard", "task_notes"])}
    assert before["visited_states"].hit_rate is None  # shipped, but its outcome is not known yet
    run.digested(1, [task("b:g:dev:1", passes=1), task("b:g:dev:2", passes=2), task("b:g:dev:3"),
                     task("b:g:dev:4")])
    got = {lv.name: lv for lv in levers.records(run.state, ["visited_states", "undo_guard", "task_notes"],
                                                banned=["undo_guard"])}
    vs = got["visited_states"]
    assert (vs.proposed, vs.shipped, vs.predicted, vs.realised) == (2, 1, 3, 2)  # b:g:dev:99 was never evaluated
    assert vs.hit_rate == pytest.approx(2 / 3)
    assert (got["undo_guard"].proposed, got["undo_guard"].shipped, got["undo_guard"].banned) == (1, 0, True)
    assert got["task_notes"].proposed == 0 and not got["task_notes"].banned
    for name, lever in got.items():
        assert lever.bucket == bucket_of(attach(name))
        assert lever.dimension == processor_type(name).dimension
        assert lever.addresses == processor_type(name).addresses


def test_hit_rates_are_kept_per_shipping_round() -> None:
    """A lever shipped in two rounds has one hit rate per round; a round whose outcome is unknown has none."""
    run = Run(HarnessConfig())
    run.digested(0, [task("b:g:dev:1"), task("b:g:dev:2")])
    run.ship(0, "C-R0-01", (attach("task_notes"),), ["b:g:dev:1", "b:g:dev:2"])
    run.digested(1, [task("b:g:dev:1", passes=1), task("b:g:dev:2"), task("b:g:dev:3")])
    run.ship(1, "C-R1-01", (Remove(group="task_notes"),), ["b:g:dev:3"])
    run.ship(1, "C-R1-02", (attach("task_notes"),), ["b:g:dev:2", "b:g:dev:3"])
    run.digested(2, [task("b:g:dev:2", passes=1), task("b:g:dev:3", passes=1)])
    run.ship(2, "C-R2-01", (Remove(group="task_notes"),), ["b:g:dev:2"])
    assert levers.hit_rates(run.state, "task_notes") == {0: 0.5, 1: 1.0}
    assert levers.hit_rates(run.state, "remove:task_notes") == {1: 1.0}  # round 2's ship has no next round yet
    assert levers.hit_rates(run.state, "undo_guard") == {}


def test_reputation_puts_untried_levers_first_then_orders_by_hit_rate() -> None:
    """An untried lever is trusted at least as much as any tried one; among tried ones a better record wins."""
    rep = levers.reputation
    untried = levers.records(Run().state, ["visited_states"])[0]
    assert untried.proposed == 0
    tried = [with_record(untried, 1, p, r) for p, r in ((4, 4), (4, 3), (4, 1), (4, 0))]
    scores = [rep(lv) for lv in tried]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    assert all(rep(untried) >= s for s in scores)
    unknown = with_record(untried, 2, 0, 0)  # proposed, never tested
    assert rep(tried[-1]) <= rep(unknown) < rep(tried[0])


def test_a_ban_flag_is_set_and_cleared_without_touching_the_record() -> None:
    """``with_flag`` marks a lever banned or not and keeps its counts."""
    lever = with_record(levers.records(Run().state, ["undo_guard"])[0], 3, 2, 1)
    banned = levers.with_flag(lever, True)
    assert banned.banned and levers.with_flag(banned, False) == lever


def test_a_levers_bucket_is_the_bucket_of_the_edit_it_names() -> None:
    """A lever editing a prompt group (reparam or remove) is in the prompt bucket, as its candidate's buckets say."""
    run = Run()
    ops: dict[str, AnyEditOp] = {"reparam:task_notes": Reparam(group="task_notes", params={"max_notes": 4}),
           "remove:system_prompt_template": Remove(group="system_prompt_template"),
           "reparam:loop_detector": Reparam(group="loop_detector", params={"warn_after": 4}),
           "remove:budget": Remove(group="budget")}
    got = {lv.name: lv.bucket for lv in levers.records(run.state, list(ops))}
    assert got == {name: bucket_of(op) for name, op in ops.items()}

