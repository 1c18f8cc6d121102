"""The counterfactual check's winning paths, on real TextWorldExpress rollouts of the ``random:`` agent.

The variant's main rollout plays coin games on the test's own nats-server; the gate's
counterfactual check then replays its solved attempts under a candidate. A candidate that
stops offering an action the recorded success needed (taking what scored) is rejected, naming
task, attempt and step; one that prunes only actions that never change the game's state
("look around", "inventory"), or the ``task_objects`` lever, keeps every path open. The
winning actions are read from the trace independently here (the room description or the
inventory changed), so the check is not graded by its own definition.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import ClassVar

import pytest

import hx.environments  # noqa: F401 - registers twx
import hx.harness.processor as processor_module
from hx.aegis.counterfactual import Paths, Replayed, decide
from hx.aegis.digester import digest_round
from hx.aegis.evidence import Evidence
from hx.aegis.gate import Forbidden, judge
from hx.aegis.operations import buckets_of
from hx.aegis.trials import Trials
from hx.aegis.winning import WinningStep, corroborated, winning_steps
from hx.environments.registry import Benchmark, benchmark
from hx.environments.rollout import RolloutSettings
from hx.environments.splits import Splits
from hx.harness.edits import apply
from hx.harness.processor import processor_type
from hx.harnesses import starter_harness
from hx.processors._choices import narrowed
from hx.runtime.models import ModelConfig
from schemas.edits import Anchor, AnyEditOp, Attach, Manifest
from schemas.envelope import Record
from schemas.hooks import BeforeModel
from schemas.ledger import CandidateProposed
from schemas.lifecycle import AttemptFinished
from schemas.messages import ToolCall
from schemas.tools import EnvObservation, ToolInvoked
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import TRACE, trace_filter

BASE = starter_harness("textworld")
TASKS = [f"twx:coin:dev:{i}" for i in range(8)]
RUN = "cf-paths"


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    """A connection to the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


@pytest.fixture
def twx() -> Iterator[Benchmark]:
    """The TextWorldExpress benchmark, its JVMs stopped after the test."""
    bench = benchmark("twx")
    yield bench
    bench.close()


@pytest.fixture
def drop_actions(monkeypatch: pytest.MonkeyPatch) -> str:
    """A lever of the test's own, registered for the test only: stop offering actions that start with a prefix."""
    monkeypatch.setattr(processor_module, "_REGISTRY", dict(processor_module._REGISTRY))

    class DropActions(processor_module.Processor, kw_only=True, dict=True, forbid_unknown_fields=True,
                      omit_defaults=True):
        """Narrow away the actions starting with one of ``prefixes``."""

        name: ClassVar[str] = "test_drop_actions"
        dimension: ClassVar[str] = "D4"

        prefixes: tuple[str, ...] = ()

        async def process(self, event: BeforeModel) -> AsyncIterator[BeforeModel]:
            """The step's offer without the dropped actions."""
            yield narrowed(event, lambda action: not action.startswith(self.prefixes))

    return DropActions.name


async def main_round(conn: Connection, twx: Benchmark) -> tuple[Trials, dict[str, list[Record]]]:
    """The variant's main rollout on coin (the gate's reference), and its passing attempts' records by subject."""
    trials = Trials(conn.log, RUN, [twx], ModelConfig(), RolloutSettings(attempts=2, max_steps=100, seed=3),
                    Splits.of(TASKS), next_round=0)
    trace_round = await trials.main("v0", BASE, TASKS)
    trials.digests = {"v0": digest_round(await Evidence(trials.log, RUN).attempts([trace_round]), {}, {})}
    records: dict[str, list[Record]] = {}
    async for record in conn.log.read(TRACE.name, subjects=[trace_filter(RUN, trace_round)]):
        records.setdefault(record.subject, []).append(record)
    passing = {s: rs for s, rs in records.items() if any(isinstance(r.event, AttemptFinished) and r.event.passed
                                                          for r in rs)}
    assert passing, "the random agent solved no coin game: the check would have nothing to replay"
    return trials, passing


def steps_taken(records: Sequence[Record]) -> list[tuple[int, str, bool]]:
    """(step, action, whether the room or the inventory changed) for each action of an attempt, from its trace."""
    out: list[tuple[int, str, bool]] = []
    before: dict[str, object] = {}
    call: ToolInvoked | None = None
    for r in records:
        if isinstance(r.event, ToolInvoked):
            call = r.event
        elif isinstance(r.event, EnvObservation):
            now = {k: r.event.info.get(k) for k in ("look", "inventory")}
            if call is not None:
                out.append((call.step, str(call.call.input["action"]), now != before))
                call = None
            before = now
    return out


def states_after(records: Sequence[Record]) -> list[str]:
    """The room description, inventory and score after each action of an attempt, from its trace."""
    out, called = [], False
    for r in records:
        if isinstance(r.event, ToolInvoked):
            called = True
        elif isinstance(r.event, EnvObservation) and called:
            out.append(f"{r.event.info.get('look')}|{r.event.info.get('inventory')}|{r.event.score}")
            called = False
    return out


def candidate(ops: tuple[AnyEditOp, ...]) -> CandidateProposed:
    """A complete proposal of ``ops`` on the starter harness."""
    m = Manifest(intended_effect="prune actions", categories=("no_progress",), predicted_flips=(TASKS[-1],),
                 evidence=(Anchor(seq=1, note="wandering"),), attribution="test_drop_actions")
    return CandidateProposed(run_id=RUN, round=0, candidate="C-R0-01", variant="v0", evolver="test", operations=ops,
                             buckets=buckets_of(ops), manifest=m, base_digest=BASE.digest,
                             digest=apply(BASE, ops).digest)


async def test_a_candidate_that_stops_offering_a_winning_action_is_rejected_naming_the_step(
        conn: Connection, twx: Benchmark, drop_actions: str) -> None:
    """No more "take ...": every recorded success that took what scored is a path closed, named by its step."""
    trials, passing = await main_round(conn, twx)
    taken = {s: [step for step, action, changed in steps_taken(rs) if changed and action.startswith("take")]
             for s, rs in passing.items()}
    assert all(taken.values()), "a solved attempt took nothing: the test's premise (coin is won by taking) is off"
    ops = (Attach(processor=drop_actions, hooks=("before_model",), params={"prefixes": ["take"]}),)
    before = (trials.next_round, trials.rollouts)
    verdict = await judge(candidate(ops), lambda: apply(BASE, ops), BASE, trials, Forbidden.of([], [], []),
                          allow_fork=False)
    check = verdict.checks[-1]
    assert (check.name, check.passed, verdict.outcome) == ("counterfactual", False, "reject")
    assert (trials.next_round, trials.rollouts) == before  # rejected before any fresh rollout
    closed = re.findall(r"(twx:coin:dev:\d+)#(\d) step (\d+) '(take [^']+)' no longer offered \(by (\w+)\)",
                        check.detail)
    assert closed and check.detail.count(" no longer offered") == len(closed), check.detail
    assert {by for *_, by in closed} == {drop_actions}  # named by the processor that narrowed it away
    closed = [c[:4] for c in closed]
    for task, attempt, step, action in closed:  # each one a take the attempt scored with, as the trace shows it
        subject = next(s for s in passing if s.endswith(f".{task}.{attempt}"))
        assert int(step) in taken[subject] and (int(step), action, True) in steps_taken(passing[subject])
    assert check.detail.startswith(f"{len(passing)} attempts replayed: {len(passing) - len(closed)} paths kept open, "
                                   f"{len(closed)} closed (")


async def test_pruning_only_actions_that_change_nothing_keeps_every_path_open(
        conn: Connection, twx: Benchmark, drop_actions: str) -> None:
    """"look around" and "inventory" were played in the solved attempts, yet never win: dropping them closes none.

    Nor do the pruning levers that remember the attempt's refused, repeated or undone actions:
    fed the winning path walked straight, they have no wandering to hold against it.
    """
    trials, passing = await main_round(conn, twx)
    played = [(step, action) for rs in passing.values() for step, action, changed in steps_taken(rs)
              if action in ("look around", "inventory")]
    assert played, "the solved attempts never looked around or took inventory: the test would prove nothing"
    assert not any(changed for rs in passing.values() for _, action, changed in steps_taken(rs)
                   if action in ("look around", "inventory"))
    assert all(w.action not in ("look around", "inventory") for rs in passing.values() for w in winning_steps(rs))
    levers = [(Attach(processor=drop_actions, hooks=("before_model",), params={"prefixes": ["look", "inventory"]}),)]
    levers += [(Attach(processor=name, hooks=processor_type(name).accepted_hooks()),)
               for name in ("task_objects", "action_pruner", "undo_guard")]  # they remember what was tried
    for ops in levers:
        passed, detail = decide(await trials.counterfactual(apply(BASE, ops), "v0"))
        assert passed, detail
        assert detail.startswith(f"{len(passing)} attempts replayed: {len(passing)} paths kept open, 0 closed; "), \
            detail


async def test_a_random_walks_detours_and_no_ops_are_not_winning(conn: Connection, twx: Benchmark) -> None:
    """Winning actions changed the state, the last one is the success, and a random walk's wandering is left out."""
    _, passing = await main_round(conn, twx)
    for records in passing.values():
        taken = steps_taken(records)
        winning = winning_steps(records)
        assert winning and winning[-1].step == taken[-1][0]  # the success itself wins
        assert {w.step for w in winning} <= {step for step, _, changed in taken if changed}  # no no-op
        assert len(winning) < len(taken)  # a random walk wanders: not every step is on the path
        reached = [after for (step, _, _), after in zip(taken, states_after(records), strict=True)
                   if step in {w.step for w in winning}]
        assert len(set(reached)) == len(reached)  # the path never comes back to a state: its loops are erased


def test_a_change_of_state_wins_only_when_another_passing_attempt_made_the_same_move() -> None:
    """Two passing attempts of one task: the move both made from the same state stays, one walk's own detour goes,
    and a scoring action stays even when only one attempt made it."""
    def step(n: int, action: str, before: str, after: str, why: str = "state changed") -> WinningStep:
        return WinningStep(step=n, call=ToolCall(id=f"c{n}", name="act", input={"action": action}), why=why,
                           before=before, after=after)

    first = (step(1, "move east", "s0", "s1"), step(2, "close door to north", "s1", "s2"),
             step(3, "take coin", "s2", "s3", why="score 0 -> 1"))
    second = (step(4, "move east", "s0", "s1"), step(7, "take coin", "s1", "s4", why="score 0 -> 1"))
    kept = corroborated([first, second])
    assert [w.action for w in kept[0]] == ["move east", "take coin"]
    assert [w.action for w in kept[1]] == ["move east", "take coin"]
    assert [w.action for w in corroborated([first])[0]] == ["take coin"]  # alone: its goal only


def _attempt(scores: Sequence[tuple[str, float, bool]]) -> list[Record]:
    """An attempt's records: the first observation, then per (action, score after, success) a call and its result."""
    def record(i: int, event: EnvObservation | ToolInvoked) -> Record:
        return Record(seq=i + 1, index=0, subject="hx.trace.r.0.t.0", type=type(event).TYPE, version=1, time_ns=0,
                      event=event)

    events: list[EnvObservation | ToolInvoked] = [EnvObservation(step=0, observation="start", info={"room": "hall"})]
    for n, (action, score, success) in enumerate(scores, start=1):
        events.append(ToolInvoked(step=n, call=ToolCall(id=f"c{n}", name="act", input={"action": action})))
        events.append(EnvObservation(step=n, observation=action, score=score, success=success, done=success,
                                     info={"room": "hall", "held": action}))
    return [record(i, e) for i, e in enumerate(events)]


def test_only_a_rise_in_score_makes_a_goal_action() -> None:
    """A penalty (the score falls) changes the state but scores nothing: no goal, so uncorroborated it is not kept."""
    winning = winning_steps(_attempt([("take knife", 1.0, False), ("eat knife", 0.5, False),
                                      ("cook meal", 2.0, True)]))
    assert [(w.action, w.why, w.goal) for w in winning] == [
        ("take knife", "score 0 -> 1", True), ("eat knife", "state changed", False),
        ("cook meal", "score 0.5 -> 2", True)]
    assert [w.action for w in corroborated([winning])[0]] == ["take knife", "cook meal"]


def test_an_attempt_with_no_winning_action_is_no_path_kept_open() -> None:
    """A passing attempt whose trace shows no winning action (no observations) had no path to keep: counted apart."""
    replayed = [Replayed("twx:coin:dev:0#0", "diverged", "step 1 before_model", Paths(winning=3)),
                Replayed("twx:coin:dev:1#0", "diverged", "step 1 before_model", Paths()),
                Replayed("twx:coin:dev:2#1", "same", "every hook returned what it did before", Paths())]
    passed, detail = decide(replayed)
    assert passed
    assert detail == ("3 attempts replayed: 1 paths kept open, 0 closed, 2 no winning action recorded; "
                      "1 unchanged, 2 diverge")
