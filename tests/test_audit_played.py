"""The audit holds each round a ledger cites to the harness it stands for, and a held-out score to its routing.

Real rounds of the toy world on the test's own nats-server: a held-out score of a forked run plays
the root's cluster under the root and the fork's cluster under the fork. Ledgers folded in memory
say what was routed where; ``played`` compares them with what each round's ``round.started`` says
it played (its variant, tasks and harness digest).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from ledger_run import STARTER, LedgerRun, attach
from toybench import RANDOM, ToyBench
from toybench import ids as toy_ids

from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.gate.rule import cluster_of
from hx.harness.edits import apply
from hx.replay.played import played
from hx.replay.trace_rounds import TraceRound, trace_marks
from projections.ledger import ROUTING, RunLedger
from schemas.ledger import HeldoutScored
from streams.config import NatsSettings
from streams.connection import connect

RUN = "routed"
FORK = apply(STARTER, (attach("explore_untried"),))
EASY, WALK = toy_ids("easy", 1, "test"), toy_ids("walk", 1, "test")
EASY_C, WALK_C = cluster_of(EASY[0]), cluster_of(WALK[0])


@pytest.fixture
async def marks(nats_url: str) -> dict[int, TraceRound]:
    """Held-out round 0: the easy task under v0 (the starter); round 1: the walk task under v1 (the fork)."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        settings = RolloutSettings(attempts=1, max_steps=4)
        root = Rollout([ToyBench()], RANDOM, STARTER, log=conn.log, settings=settings)
        await root.start(RUN, kind="evolve")
        await root.run_round(RUN, 0, EASY, role="heldout", label=RoundLabel(purpose="heldout", variant="v0",
                                                                          stage_round=0))
        fork = Rollout([ToyBench()], RANDOM, FORK, log=conn.log, settings=settings)
        await fork.run_round(RUN, 1, WALK, role="heldout", label=RoundLabel(purpose="heldout", variant="v1",
                                                                          stage_round=0))
        return await trace_marks(conn.log, RUN)


def ledger(clusters: tuple[str, ...], tasks: int = 2, ops: Sequence[object] = (),
           routing: str | None = ROUTING) -> RunLedger:
    """A run whose job names ``routing`` (None: no rule) and whose round-0 fork v1 serves ``clusters``, then a
    held-out score citing trace round 0."""
    run = LedgerRun(STARTER, run_id=RUN)
    loop = {} if routing is None else {"routing": routing}
    run.records[0] = msgspec.structs.replace(run.records[0], settings={"loop": loop})
    run.proposed(0, "C-R0-01", (attach("explore_untried"), *ops))  # type: ignore[arg-type]
    run.forked(0, "C-R0-01", "v1", clusters)
    run.records.append(HeldoutScored(run_id=RUN, round=0, trace_round=0, heldout_digest="", tasks=tasks))
    return RunLedger.of(run.records)


def texts(found: object) -> list[str]:
    return [p.text for p in found.problems]  # type: ignore[attr-defined]


async def test_a_held_out_score_played_under_the_ledgers_routing_passes(marks: dict[int, TraceRound]) -> None:
    honest = played(marks, ledger((WALK_C,)))
    assert texts(honest) == [] and honest.rounds == 2 and honest.unchecked == []


async def test_a_task_played_under_another_variant_than_its_route_is_named(marks: dict[int, TraceRound]) -> None:
    """The ledger routes both clusters to the fork: the root's round played a task the fork served."""
    assert texts(played(marks, ledger((EASY_C, WALK_C)))) == [
        f"event 5 (ledger.heldout_scored): trace round 0 played {EASY[0]} under v0; the ledger then routed {EASY_C} "
        "to v1"]


@pytest.mark.parametrize("routing", [None, "nearest_neighbour"])
async def test_a_routing_rule_the_job_does_not_name_or_this_hx_does_not_know_is_not_checked(
        marks: dict[int, TraceRound], routing: str | None) -> None:
    """The same misrouted score under a job recorded before jobs named their routing rule, or naming one a later hx
    brought: not called wrong by today's rule, said to be unchecked; the harnesses are still held to account."""
    found = played(marks, ledger((EASY_C, WALK_C), routing=routing))
    assert texts(found) == [] and found.rounds == 2
    why = ("its job, recorded before jobs named one, names no routing rule" if routing is None else
           f"its job names the routing rule {routing!r}, which this hx does not know")
    assert found.unchecked == [f"event 5 (ledger.heldout_scored) and the held-out scores after it: which variant "
                               f"each task ran under ({why})"]


async def test_a_fork_of_another_harness_than_the_round_played_is_named(marks: dict[int, TraceRound]) -> None:
    """The fork the ledger holds is not the harness the fork's held-out round played."""
    other = apply(STARTER, (attach("explore_untried"), attach("undo_guard")))
    [said] = texts(played(marks, ledger((WALK_C,), ops=(attach("undo_guard"),))))
    assert said == (f"event 5 (ledger.heldout_scored): trace round 1 played harness {FORK.digest[:19]}..., but it "
                    f"stands for the harness v1 had when the score was recorded, {other.digest[:19]}...")


async def test_a_score_of_more_tasks_than_its_rounds_ran_is_named(marks: dict[int, TraceRound]) -> None:
    assert texts(played(marks, ledger((WALK_C,), tasks=3))) == [
        "event 5 (ledger.heldout_scored): its held-out rounds from trace round 0 ran 2 task(s); it records 3"]
