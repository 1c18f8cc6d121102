"""The replay buffer against a real nats-server, folded from real rollouts of a small run.

The run: rounds of two harness versions and two ``random:`` model specs on the toy
corridor benchmark, one held-out round, one careless adaptation round that lists the
held-out task, and a round of another run on the same log.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import pytest
from toybench import ToyBench, ids

from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.environments.splits import SplitRole
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.processors.training_bridge import attempt_to_rl_records
from hx.runtime.models import ModelConfig
from projections.base import state_digest
from projections.buffer_snapshot import BufferSnapshot, BufferState
from projections.registry import PROJECTIONS
from projections.replay_buffer import ReplayBuffer, groups, rounds, size, trajectories
from projections.runner import ProjectionRunner
from projections.testing import check_live_equals_rebuilt, fold_all
from projections.trajectories import Trajectory, Turn
from schemas.envelope import Record
from schemas.history import packed, resolve
from schemas.hooks import HookRecord
from schemas.lifecycle import AttemptStarted, RoundStarted
from schemas.messages import Message, ToolCall, ToolSchema
from schemas.model import ModelRequest, ModelResponse
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress, trace_filter

RUN = "rb"
WINDOW = 3
SETTINGS = RolloutSettings(attempts=2, concurrency=2, max_steps=8, seed=3)
TASKS = ids("easy", 1) + ids("walk", 1)
HELDOUT = ids("walk", 1, "test")


@dataclass(frozen=True)
class Setup:
    """One harness version and one model spec."""

    model: str
    harness: HarnessConfig


A = Setup("random:", HarnessConfig())
B = Setup("random:act", starter_harness("textworld"))
PLAN: list[tuple[Setup, list[str], SplitRole]] = [
    (A, TASKS, "adaptation"),              # round 0: evicted when round 4 finishes
    (B, [*TASKS, *HELDOUT], "adaptation"),  # round 1: careless, lists the held-out task
    (A, HELDOUT, "heldout"),               # round 2: never enters; purges the task from round 1
    (B, TASKS, "adaptation"),              # round 3
    (A, TASKS, "adaptation"),              # round 4
]


def buffer() -> ReplayBuffer:
    return ReplayBuffer(RUN, window=WINDOW)


async def run_rounds(log: EventLog) -> AsyncIterator[int]:
    """Append the run's rounds (and a round of another run), yielding after each."""
    made = {s.model: Rollout(ToyBench(), ModelConfig(main=s.model), s.harness, log=log, settings=SETTINGS)
            for s in (A, B)}
    await made[A.model].run_round("other", 0, TASKS[:1])
    await made[A.model].start(RUN)
    for number, (setup, tasks, role) in enumerate(PLAN):
        await made[setup.model].run_round(RUN, number, tasks, role=role)
        yield number
    await made[A.model].finish(RUN, rounds=len(PLAN))


async def write_run(log: EventLog) -> list[Record]:
    """Run every round; return the run's records as the log holds them (conversations as deltas)."""
    async for _ in run_rounds(log):
        pass
    return [r async for r in log.read(TRACE.name, subjects=[trace_filter(RUN)])]


@pytest.fixture
async def logged(nats_url: str) -> AsyncIterator[tuple[EventLog, list[Record]]]:
    async with connect(NatsSettings(url=nats_url)) as conn:
        yield conn.log, await write_run(conn.log)


async def rebuilt(log: EventLog) -> ProjectionRunner[BufferState]:
    runner = ProjectionRunner(log, buffer())
    await runner.rebuild()
    return runner


def digests() -> dict[str, str]:
    return {A.model: A.harness.digest, B.model: B.harness.digest}


# --- the window, held-out rounds, groups -----------------------------------------------------------------------


async def test_the_window_keeps_the_last_finished_rounds_and_never_a_heldout_task(
        logged: tuple[EventLog, list[Record]]) -> None:
    log, records = logged
    state = (await rebuilt(log)).state
    assert rounds(state) == [1, 3, 4]  # round 0 evicted, held-out round 2 never held
    assert state.evicted == len(TASKS) * SETTINGS.attempts and "0" not in state.trajectories
    assert state.heldout_rounds == {2} and state.heldout_tasks == set(HELDOUT)
    held = trajectories(state)
    assert size(state) == len(held) == 3 * len(TASKS) * SETTINGS.attempts
    assert {(t.round, t.task_id, t.attempt) for t in held} == {
        (r, task, a) for r in (1, 3, 4) for task in TASKS for a in range(SETTINGS.attempts)}
    assert state.dropped == SETTINGS.attempts  # round 1's attempts at the held-out task, purged
    assert not state.attempts and not state.running  # nothing in flight once every round finished
    assert all(t.run_id == RUN for t in held)  # the other run's round is not read
    # The held-out round really ran on the log, attempts and model turns included.
    in_round_2 = {TraceAddress.parse(r.subject).round for r in records if isinstance(r.event, ModelResponse)}
    assert 2 in in_round_2


async def test_an_evolution_rounds_trace_rounds_enter_and_leave_the_window_together(nats_url: str) -> None:
    # An evolution run labels each trace round (main, gate, ...) with its evolution round: the window counts those.
    stages = [0, 0, 1, 2, 2, 2]
    async with connect(NatsSettings(url=nats_url)) as conn:
        rollout = Rollout(ToyBench(), ModelConfig(main="random:"), HarnessConfig(), log=conn.log, settings=SETTINGS)
        await rollout.start("evo")
        runner = ProjectionRunner(conn.log, ReplayBuffer("evo", window=2))
        held = []
        for number, stage in enumerate(stages):
            purpose = "main" if number == 0 or stage != stages[number - 1] else "gate"
            await rollout.run_round("evo", number, TASKS[:1],
                                    label=RoundLabel(purpose=purpose, stage_round=stage))
            await runner.catch_up()
            held.append(rounds(runner.state))
    assert held == [[0], [0, 1], [0, 1, 2], [2, 3], [2, 3, 4], [2, 3, 4, 5]]
    assert runner.state.evicted == 2 * SETTINGS.attempts and set(runner.state.slots) == {"2", "3", "4", "5"}


async def test_groups_span_harness_versions_model_versions_and_rounds(logged: tuple[EventLog, list[Record]]) -> None:
    log, _ = logged
    state = (await rebuilt(log)).state
    by_task = groups(state)
    assert sorted(by_task) == sorted(TASKS)
    for task, group in by_task.items():
        assert all(t.task_id == task for t in group) and len(group) == 3 * SETTINGS.attempts
        assert {t.round for t in group} == {1, 3, 4}
        assert {t.harness_digest for t in group} == set(digests().values())
        assert {t.model_version for t in group} == {A.model, B.model}
        for t in group:
            assert t.harness_digest == digests()[t.model] and t.model == t.model_version
            assert t.reward == (1.0 if t.passed else 0.0) and t.status in ("completed", "budget_exhausted")
    assert {t.passed for t in trajectories(state)} == {True, False}  # rewards differ within the window


# --- the turns: exact contexts, completions, behaviour log-probs -----------------------------------------------


def turn_key(record: Record, step: int, role: str) -> tuple[str, int, str]:
    return record.subject, step, role


async def test_each_turn_is_the_context_the_model_saw_with_its_logprobs(
        logged: tuple[EventLog, list[Record]]) -> None:
    log, records = logged
    state = (await rebuilt(log)).state
    # The prompts are on the log as deltas: the buffer must have resolved them.
    raw = [r.event for r in records if isinstance(r.event, ModelRequest)]
    assert any((h := packed(ev)) is not None and h.ordinal > 0 and not ev.messages for ev in raw)
    resolved = list(resolve(records))
    requests = {turn_key(r, r.event.step, r.event.role): r.event for r in resolved if isinstance(r.event, ModelRequest)}
    responses = {turn_key(r, r.event.step, r.event.role): r.event for r in resolved
                 if isinstance(r.event, ModelResponse)}
    subjects = {(e.round, e.task_id, e.attempt): r.subject for r in records if isinstance(e := r.event, AttemptStarted)}
    turns = 0
    for t in trajectories(state):
        subject = subjects[(t.round, t.task_id, t.attempt)]
        assert [turn.step for turn in t.turns] == sorted(s for (subj, s, _) in responses if subj == subject)
        for turn in t.turns:
            req, resp = requests[(subject, turn.step, "main")], responses[(subject, turn.step, "main")]
            assert turn.messages == req.messages and len(turn.messages) >= 2
            assert (turn.tools, turn.params) == (req.tools, req.params)
            assert (turn.completion.role, turn.completion.content) == ("assistant", resp.content)
            assert turn.completion.tool_calls == resp.tool_calls
            assert turn.logprobs == tuple(lp.logprob for lp in resp.logprobs) and turn.logprobs
            assert turn.model_version == resp.model_version == t.model_version
            turns += 1
    assert turns > 3 * len(TASKS) * SETTINGS.attempts  # most attempts take several steps


async def test_turns_agree_with_the_training_bridge(logged: tuple[EventLog, list[Record]]) -> None:
    log, records = logged
    state = (await rebuilt(log)).state
    bridge = {(r.round, r.task_id, r.attempt, r.step): r for r in attempt_to_rl_records(records)}
    compared = 0
    for t in trajectories(state):
        for turn in t.turns:
            rl = bridge[(t.round, t.task_id, t.attempt, turn.step)]
            assert (rl.prompt, rl.tools, rl.completion, rl.on_policy) == (
                turn.messages, turn.tools, turn.completion, turn.on_policy)
            assert tuple(lp.logprob for lp in rl.logprobs) == turn.logprobs
            assert (rl.reward, rl.passed, rl.harness_digest) == (t.reward, t.passed, t.harness_digest)
            compared += 1
    assert compared == sum(len(t.turns) for t in trajectories(state)) > 0


# --- determinism: live == rebuilt, checkpoints ----------------------------------------------------------------


async def test_following_live_equals_rebuilding(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await check_live_equals_rebuilt(conn.log, buffer, run_rounds, checkpoint_every=40)
        state = (await rebuilt(conn.log)).state
    assert result.catch_ups == len(PLAN) and len(set(result.digests.values())) == 1
    assert result.digest == state_digest(state) and size(state) > 0


async def test_a_checkpoint_taken_mid_attempt_resumes_to_the_rebuilt_state(
        logged: tuple[EventLog, list[Record]]) -> None:
    log, records = logged
    full = await rebuilt(log)
    # Stop inside an attempt of round 3 (inside its frame, too), while it is in flight, and checkpoint there.
    mid = next(i for i, r in enumerate(records) if isinstance(r.event, ModelResponse) and r.event.step == 3
               and TraceAddress.parse(r.subject).round == 3)
    first = ProjectionRunner(log, buffer())
    for record in records[:mid + 1]:
        first.apply(record)
    assert first.state.attempts and first.state.running == {3}  # partials are part of the checkpoint
    cp = await first.checkpoint()
    assert (cp.seq, cp.index) == records[mid].position
    resumed = ProjectionRunner(log, buffer())
    assert await resumed.load() == records[mid].position and resumed.digest == first.digest
    await resumed.catch_up()
    assert resumed.digest == full.digest and resumed.applied == full.applied
    decoded = resumed.projection.decode(resumed.projection.encode(resumed.state))
    assert trajectories(decoded) == trajectories(full.state) and groups(decoded) == groups(full.state)
    # The partials' conversations come back sharing their messages with the turns read so far.
    restored = first.projection.decode(first.projection.encode(first.state))
    assert state_digest(restored) == first.digest
    checked = 0
    for partial in restored.attempts.values():
        requests = [t.request for t in partial.turns if t.request is not None]
        if requests:
            assert requests[-1].messages[0] is partial.conversation[0]
            checked += 1
    assert checked


# --- checkpoints: compact, and sharing messages once decoded ---------------------------------------------------


def messages_of(state: BufferState) -> list[Message]:
    return [m for t in trajectories(state) for turn in t.turns for m in (*turn.messages, turn.completion)]


def distinct_values(state: BufferState) -> set[bytes]:
    return set(map(msgspec.msgpack.encode, messages_of(state)))


async def test_a_snapshot_restores_the_state_with_its_digest_and_shared_messages(
        logged: tuple[EventLog, list[Record]]) -> None:
    log, _ = logged
    runner = await rebuilt(log)
    projection, state = runner.projection, runner.state
    data = projection.encode(state)
    decoded = projection.decode(data)
    assert state_digest(decoded) == runner.digest and trajectories(decoded) == trajectories(state)
    assert projection.encode(decoded) == data  # a snapshot is a function of the state's value
    assert len(data) < len(msgspec.msgpack.encode(state)) / 3  # this small run's contexts are a few steps long
    # Each distinct message is one object, which every turn holding it shares: the next turn's context too.
    table = msgspec.msgpack.decode(data, type=BufferSnapshot).messages
    assert len({id(m) for m in messages_of(decoded)}) == len(table) < len(messages_of(decoded)) / 4
    for t in trajectories(decoded):
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            assert before.messages[0] is after.messages[0] and before.completion in after.messages
            assert any(m is before.completion for m in after.messages)


def conversation_state(steps: int, attempts: int = 1, window: int = 0) -> BufferState:
    """A round of ``attempts`` equal attempts of ``steps`` turns: each adds a tool call and a ~300-byte result,
    the context growing, or sliding over the last ``window`` messages after the first two."""
    by_key: dict[str, Trajectory] = {}
    for attempt in range(attempts):  # the same values, built afresh: other objects
        context: tuple[Message, ...] = (Message(role="system", content="play"), Message(role="user", content="task"))
        tools = (ToolSchema(name="act", input_schema={"type": "object"}),)
        turns = []
        for step in range(steps):
            done = Message(role="assistant", tool_calls=(ToolCall(id=f"c{step}", name="act", input={"n": step}),))
            turns.append(Turn(step=step, role="main", model="m", model_version="v", messages=context, tools=tools,
                              params={"seed": step}, completion=done, logprobs=(-0.5,), on_policy=True))
            result = Message(role="tool", content=f"{step}: " + "you see a coin. " * 18, tool_call_id=f"c{step}")
            context = (*context, done, result)
            if window and len(context) > window + 2:
                context = (*context[:2], *context[-window:])
        by_key[f"t/{attempt}"] = Trajectory(run_id="r", round=0, task_id="t", attempt=attempt, harness_digest="h",
                                            model="m", model_version="v", reward=1.0, passed=True,
                                            status="completed", turns=tuple(turns))
    return BufferState(rounds=[0], trajectories={"0": by_key})


@pytest.mark.parametrize("window", [0, 12])
def test_a_snapshot_grows_with_the_distinct_messages_not_with_turns_times_context(window: int) -> None:
    projection = ReplayBuffer("r")
    for steps in (40, 80):
        state = conversation_state(steps, window=window)
        data = projection.encode(state)
        distinct = sum(map(len, distinct_values(state)))
        full = sum(len(msgspec.msgpack.encode(turn.messages)) for turn in state.trajectories["0"]["t/0"].turns)
        assert distinct < len(data) < 1.5 * distinct and len(data) < full / (4 if window else 10)
        decoded = projection.decode(data)
        assert decoded == state and state_digest(decoded) == state_digest(state)
        assert len({id(m) for m in messages_of(decoded)}) == len(distinct_values(state))
    # Twice the turns, twice the snapshot (not four times); a second equal attempt adds only its turns.
    assert len(projection.encode(conversation_state(80, window=window))) < 2.2 * len(
        projection.encode(conversation_state(40, window=window)))
    assert len(projection.encode(conversation_state(40, attempts=2, window=window))) < 1.3 * len(
        projection.encode(conversation_state(40, window=window)))


def test_values_that_compare_equal_but_encode_apart_stay_apart() -> None:
    projection = ReplayBuffer("r")
    state = conversation_state(3)
    one, other = (Message(role="assistant", tool_calls=(ToolCall(id="c", name="act", input={"n": n}),))
                  for n in (1, 1.0))
    assert one == other
    turn = msgspec.structs.replace(state.trajectories["0"]["t/0"].turns[0], messages=(one, other))
    state.trajectories["0"]["t/0"] = msgspec.structs.replace(state.trajectories["0"]["t/0"], turns=(turn,))
    assert state_digest(projection.decode(projection.encode(state))) == state_digest(state)


def test_any_contexts_and_tool_lists_round_trip() -> None:
    """Contexts growing, replaced, trimmed or empty, equal by value across objects; tool lists empty or not."""
    rng = random.Random(7)
    pool = [Message(role="user", content=str(i)) for i in range(6)]
    tool_lists = [(), (ToolSchema(name="a"),), (ToolSchema(name="b"),), (ToolSchema(name="a"),)]
    projection = ReplayBuffer("r")
    for _ in range(300):
        by_key: dict[str, Trajectory] = {}
        for attempt in range(rng.randint(1, 3)):
            turns: list[Turn] = []
            context: tuple[Message, ...] = ()
            for step in range(rng.randint(0, 8)):
                change = rng.random()
                if change < 0.3:  # a new context, some messages built afresh
                    context = tuple(rng.choice(pool) if rng.random() < 0.7 else Message(role="user", content=str(i))
                                    for i in rng.choices(range(6), k=rng.randint(0, 10)))
                elif change < 0.7:
                    context = (*context, *rng.choices(pool, k=rng.randint(0, 3)))
                else:  # a trimmed window
                    context = (*context[:rng.randint(0, 2)], *context[rng.randint(0, len(context)):], rng.choice(pool))
                turns.append(Turn(step=step, role="main", model=rng.choice("mn"), model_version="v", messages=context,
                                  tools=rng.choice(tool_lists), params={}, completion=rng.choice(pool), logprobs=(),
                                  on_policy=True))
            by_key[f"t/{attempt}"] = Trajectory(
                run_id="r", round=0, task_id="t", attempt=attempt, harness_digest="h", model="m", model_version="v",
                reward=0.0, passed=False, status="completed", turns=tuple(turns))
        state = BufferState(rounds=[0], trajectories={"0": by_key})
        data = projection.encode(state)
        decoded = projection.decode(data)
        assert decoded == state and state_digest(decoded) == state_digest(state) and projection.encode(decoded) == data


def test_an_inconsistent_snapshot_is_a_decode_error() -> None:
    projection = ReplayBuffer("r")
    snap = msgspec.msgpack.decode(projection.encode(conversation_state(3)), type=BufferSnapshot)
    for contexts in ([(0, ((0, 2),))], [(-1, (len(snap.messages),))]):  # a span of no base; no such message
        torn = msgspec.msgpack.encode(msgspec.structs.replace(snap, contexts=contexts))
        with pytest.raises(msgspec.DecodeError):
            projection.decode(torn)


# --- pure folds over the logged records ----------------------------------------------------------------------


async def test_in_flight_partials_stay_bounded_and_gaps_drop_the_attempt(
        logged: tuple[EventLog, list[Record]]) -> None:
    _, records = logged
    projection = buffer()
    state, most = projection.initial(), 0
    for record in records:
        if record.type in projection.reads:
            state = projection.fold(state, record)
            most = max(most, len(state.attempts))
    assert 0 < most <= SETTINGS.concurrency and not state.attempts
    assert state_digest(state) == state_digest(fold_all(projection, records))

    # A conversation delta whose base was never read: that attempt is dropped, never given a wrong context.
    victim = next(t for t in trajectories(state) if len(t.turns) >= 2)
    address = (victim.round, victim.task_id, victim.attempt)
    index = next(i for i, r in enumerate(records)
                 if (a := TraceAddress.parse(r.subject)) and (a.round, a.task, a.attempt) == address
                 and isinstance(r.event, HookRecord) and (h := packed(r.event)) is not None and h.ordinal == 2)
    gapped = fold_all(buffer(), records[:index] + records[index + 1:])
    assert gapped.dropped == state.dropped + 1
    assert {(t.round, t.task_id, t.attempt) for t in trajectories(gapped)} == (
        {(t.round, t.task_id, t.attempt) for t in trajectories(state)} - {address})

    # A round whose RoundStarted was not read has no known split: none of its attempts enter.
    unstarted = [r for r in records if not (isinstance(r.event, RoundStarted) and r.event.round == 4)]
    blind = fold_all(buffer(), unstarted)
    assert rounds(blind) == [0, 1, 3] and 4 not in {t.round for t in trajectories(blind)}


# --- construction ---------------------------------------------------------------------------------------------


def test_a_buffer_is_named_and_filtered_by_its_run_and_configuration() -> None:
    plain = ReplayBuffer("run-9")
    assert (plain.name, plain.subjects, plain.window, plain.roles) == (
        "replay_buffer.run-9", (trace_filter("run-9"),), 4, ("main",))
    assert type(plain) is type(ReplayBuffer("run-9")) and isinstance(plain, ReplayBuffer)
    names = {ReplayBuffer("run-9", window=2).name, ReplayBuffer("run-9", roles=("main", "judge")).name,
             ReplayBuffer("run-9", reward="passed").name, plain.name, ReplayBuffer("run-8").name}
    assert len(names) == 5  # a checkpoint never restores into a buffer configured otherwise
    for bad in ({"run_id": "no spaces"}, {"run_id": "r", "window": 0}, {"run_id": "r", "roles": ()}):
        with pytest.raises(ValueError):
            ReplayBuffer(**bad)
    assert "replay_buffer" not in PROJECTIONS  # the registry builds projections without arguments
    state = BufferState(rounds=[1], trajectories={"1": {"t/0": Trajectory(
        run_id="r", round=1, task_id="t", attempt=0, harness_digest="h", model="m", model_version="v",
        reward=1.0, passed=True, status="completed", turns=())}})
    assert plain.decode(plain.encode(state)) == state
