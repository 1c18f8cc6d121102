"""Projections against a real nats-server: trace store, task history and their runner.

Every test folds a realistic generated log: several runs, rounds, tasks and attempts
interleaved as concurrent attempts would be, appended as single-event messages and as
frames, with run- and round-level events and a few undecodable messages among them.
The plan that generates the log is also the oracle the projections are checked against.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

import msgspec
import pytest
from every_event import EveryEvent

from projections.base import Projection, state_digest
from projections.errors import AsOfError
from projections.runner import START, Checkpoint, ProjectionRunner
from projections.snapshots import Snapshots, snapshot_name
from projections.task_history import TaskHistory, TaskRound, pass_at_k, round_key
from projections.testing import (
    ProjectionKit,
    ProjectionMismatch,
    check_exactly_once,
    check_live_equals_rebuilt,
    check_time_travel,
    fold_all,
    last_position,
    wait_until,
)
from projections.trace_store import AttemptTrace, TraceStore, attempt_key
from schemas import (
    AttemptFinished,
    AttemptStarted,
    AttemptStatus,
    Event,
    HookRecord,
    Message,
    Record,
    RoundFinished,
    RoundStarted,
    RunFinished,
    RunStarted,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskSpec,
    TaskStart,
    ToolCall,
    ToolInvoked,
    VerifierScore,
)
from schemas.envelope import HX_SCHEMA_VERSION, HX_TIME, HX_TYPE, EncodedEvent, encode_body, encoded
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.log import EventLog
from streams.outgoing import Entry
from streams.topology import BLOB_STORE, POSITIONS_BUCKET, trace_subject

PROJECTIONS: dict[str, Callable[[], Projection[Any]]] = {"trace_store": TraceStore, "task_history": TaskHistory}

# --- the generated log --------------------------------------------------------------------------


@dataclass
class AttemptPlan:
    """One attempt of the generated log and what the projections must make of it."""

    run: str
    round: int
    task: str
    attempt: int
    steps: int
    status: AttemptStatus | None
    """None: the attempt is still running when the log ends."""
    passed: bool
    verifier: tuple[bool, float] | None
    final_score: float

    @property
    def subject(self) -> str:
        return trace_subject(self.run, self.round, self.task, self.attempt)

    @property
    def key(self) -> str:
        return attempt_key(self.run, self.round, self.task, self.attempt)

    @property
    def finished(self) -> bool:
        return self.status is not None

    @property
    def verdict(self) -> bool:
        """Passed as task history counts it: an infrastructure failure is a failure."""
        return self.passed and self.status != "infra_failure"

    @property
    def summaries(self) -> int:
        """The attempt's summary events (on its channels): what the trace store folds."""
        return sum(1 for e in self.events() if type(e).CHANNEL)

    def events(self) -> list[Event]:
        spec = TaskSpec(id=self.task, instruction=f"solve {self.task}", benchmark="twx")
        out: list[Event] = [
            AttemptStarted(run_id=self.run, round=self.round, task_id=self.task, attempt=self.attempt,
                           harness_digest=f"h{self.round}", model=f"model-{self.attempt % 2}", seed=self.attempt),
            HookRecord(stage="emitted", step=0, event=TaskStart(task=spec, system_prompt="be brief")),
        ]
        for step in range(1, self.steps + 1):
            out.append(HookRecord(stage="emitted", step=step, event=StepStart(step=step)))
            call = ToolCall(id=f"c{step}", name="look", input={"step": step})
            out.append(ToolInvoked(step=step, call=call))
            out.append(HookRecord(stage="returned", step=step, event=StepEnd(
                step=step, messages=(Message(role="assistant", content=f"step {step}"),), done=step == self.steps)))
        if self.verifier is not None:
            ok, score = self.verifier
            out.append(VerifierScore(verifier="exact", passed=ok, score=score, reward=score))
        if self.status is not None:
            out.append(HookRecord(stage="emitted", step=0, event=TaskEnd(
                task_id=self.task, passed=self.passed, score=self.final_score, steps=self.steps, status=self.status)))
            out.append(AttemptFinished(
                run_id=self.run, round=self.round, task_id=self.task, attempt=self.attempt, passed=self.passed,
                score=self.final_score, steps=self.steps, status=self.status,
                reason="sandbox lost" if self.status == "infra_failure" else ""))
        return out

    # What the trace store must hold.
    @property
    def outcome(self) -> str:
        if self.status is None:
            return "running"
        if self.status == "infra_failure":
            return "infra_failure"
        return "passed" if self.passed else "failed"

    @property
    def score(self) -> float:
        if self.status is not None:
            return self.final_score
        return self.verifier[1] if self.verifier is not None else 0.0


@dataclass
class Garbage:
    """A raw message no reader can decode."""

    subject: str
    body: bytes
    headers: dict[str, str] | None
    seq: int = 0


Op = tuple[str, Any]


@dataclass
class LogPlan:
    """A generated log: the ordered append operations and the attempts they describe."""

    attempts: list[AttemptPlan]
    ops: list[Op]
    garbage: list[Garbage] = field(default_factory=list)
    run_level: int = 0
    """Run- and round-level events (filed under no attempt)."""

    def attempt(self, key: str) -> AttemptPlan:
        return next(a for a in self.attempts if a.key == key)

    def rounds(self) -> dict[str, list[AttemptPlan]]:
        """Finished attempts by task-history key."""
        out: dict[str, list[AttemptPlan]] = {}
        for a in self.attempts:
            if a.finished:
                out.setdefault(round_key(a.run, a.round, a.task), []).append(a)
        return out


RUNS = ("alpha", "beta.2")  # a dot in a run id must survive the subject token escaping
TASKS = ("twx:coin:1", "twx:cook:2", "sci.world/3", "gaia 4")


def generate(seed: int = 7, *, runs: tuple[str, ...] = RUNS, rounds: int = 2, tasks: tuple[str, ...] = TASKS,
             attempts: int = 3) -> LogPlan:
    """A deterministic log: runs with rounds of interleaved attempts, frames, and garbage."""
    rng = random.Random(seed)
    plans: list[AttemptPlan] = []
    ops: list[Op] = [("event", (trace_subject(run), RunStarted(run_id=run, seed=seed))) for run in runs]
    run_level = len(runs)
    garbage_kinds = itertools.cycle(_GARBAGE)
    for rnd in range(rounds):
        round_plans: list[AttemptPlan] = []
        for run in runs:
            ops.append(("event", (trace_subject(run, rnd), RoundStarted(
                run_id=run, round=rnd, harness_digest=f"h{rnd}", task_ids=tasks, attempts_per_task=attempts))))
            run_level += 1
            for task in tasks:
                for n in range(attempts):
                    roll = rng.random()
                    status: AttemptStatus | None = (
                        None if roll < 0.08 else "infra_failure" if roll < 0.25
                        else "budget_exhausted" if roll < 0.32 else "completed")
                    passed = status in ("completed", "infra_failure") and rng.random() < 0.55
                    verifier = (passed, round(rng.random(), 3)) if rng.random() < 0.7 else None
                    round_plans.append(AttemptPlan(run, rnd, task, n, rng.randint(1, 4), status, passed,
                                                   verifier, round(rng.random(), 3)))
        # Attempts of a round run concurrently: their events interleave on the log.
        cursors = {i: (p, p.events(), 0) for i, p in enumerate(round_plans)}
        while cursors:
            pick = rng.choice(sorted(cursors))
            plan, events, at = cursors[pick]
            chunk = events[at:at + rng.randint(1, 5)]
            framed = rng.random() < 0.5 and len(chunk) > 1
            ops.append(("frames" if framed else "singles", (plan.subject, chunk, rng.randint(2, 3), at)))
            if at + len(chunk) >= len(events):
                del cursors[pick]
            else:
                cursors[pick] = (plan, events, at + len(chunk))
            if rng.random() < 0.04:
                subject = plan.subject if rng.random() < 0.5 else trace_subject(plan.run)
                ops.append(("garbage", next(garbage_kinds)(subject)))
        plans.extend(round_plans)
        for run in runs:
            done = [p for p in round_plans if p.run == run and p.finished]
            ops.append(("event", (trace_subject(run, rnd), RoundFinished(
                run_id=run, round=rnd, attempts=len(done), passed=sum(p.verdict for p in done)))))
            run_level += 1
    for run in runs:
        ops.append(("event", (trace_subject(run), RunFinished(run_id=run, rounds=rounds))))
        run_level += 1
    # Always at least one of each kind of garbage, one of them the log's very last message.
    for make in _GARBAGE:
        ops.insert(rng.randrange(len(ops)), ("garbage", make(trace_subject(runs[0], 0, tasks[0], 0))))
    ops.append(("garbage", _GARBAGE[0](trace_subject(runs[-1]))))
    return LogPlan(plans, ops, [g for kind, g in ops if kind == "garbage"], run_level)


def _valid_started() -> bytes:
    return encode_body(AttemptStarted(run_id="x", round=0, task_id="t", attempt=0))


_GARBAGE: tuple[Callable[[str], Garbage], ...] = (
    lambda s: Garbage(s, b"not an event", None),  # no Hx-Type header at all
    lambda s: Garbage(s, _valid_started(), {HX_TYPE: "no.such.type", HX_SCHEMA_VERSION: "1"}),
    lambda s: Garbage(s, b"\xc1\xc1\xc1", {HX_TYPE: AttemptStarted.TYPE, HX_SCHEMA_VERSION: "1"}),
    lambda s: Garbage(s, _valid_started(), {HX_TYPE: AttemptStarted.TYPE, HX_SCHEMA_VERSION: "99"}),
    lambda s: Garbage(s, b"\x93\x01", {HX_TYPE: "hx.frame", HX_SCHEMA_VERSION: "1", HX_TIME: "1"}),
)


async def apply_op(log: EventLog, op: Op) -> None:
    """Perform one append operation of a plan."""
    kind, arg = op
    if kind == "event":
        subject, event = arg
        await log.append(subject, event, key=f"{subject}#{type(event).TYPE}")
    elif kind in ("singles", "frames"):
        subject, chunk, frame_size, at = arg
        entries = [Entry(subject, ev, key=f"{subject}#{at + i}") for i, ev in enumerate(chunk)]
        if kind == "singles":
            for entry in entries:
                await log.append(entry.subject, entry.event, key=entry.key)
        else:
            await log.append_batch(entries, frame_size=frame_size)
    else:
        garbage: Garbage = arg
        ack = await log.js.publish(garbage.subject, garbage.body, headers=garbage.headers)
        garbage.seq = ack.seq


def script(plan: LogPlan, every: int = 3) -> Callable[[EventLog], AsyncIterator[object]]:
    """The plan as a kit append script, yielding after every ``every`` operations."""
    async def append_events(log: EventLog) -> AsyncIterator[object]:
        for i, op in enumerate(plan.ops, 1):
            await apply_op(log, op)
            if i % every == 0:
                yield i
    return append_events


async def write(log: EventLog, plan: LogPlan, ops: slice = slice(None)) -> None:
    for op in plan.ops[ops]:
        await apply_op(log, op)


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


@pytest.fixture
def plan() -> LogPlan:
    return generate()


@pytest.fixture
async def written(conn: Connection, plan: LogPlan) -> LogPlan:
    """The plan, appended to the test's log."""
    await write(conn.log, plan)
    return plan


async def rebuilt(log: EventLog, projection: Projection[Any]) -> ProjectionRunner[Any]:
    runner = ProjectionRunner(log, projection)
    await runner.rebuild()
    return runner


async def records(log: EventLog, types: frozenset[str] = frozenset()) -> list[Record]:
    return [r async for r in log.read(types=types)]


def test_generated_log_is_realistic(plan: LogPlan) -> None:
    """Guard the generator: the log it makes has everything the tests below rely on."""
    statuses = {a.status for a in plan.attempts}
    assert statuses == {None, "completed", "infra_failure", "budget_exhausted"}
    assert {a.passed for a in plan.attempts if a.status == "infra_failure"} == {True, False}
    assert any(a.verifier is not None and not a.finished for a in plan.attempts)
    assert {kind for kind, _ in plan.ops} == {"event", "singles", "frames", "garbage"}
    assert len(plan.garbage) >= len(_GARBAGE) + 1
    assert len({(a.run, a.round) for a in plan.attempts}) == len(RUNS) * 2
    assert sum(len(a.events()) for a in plan.attempts) > 500


# --- the kit: live (polled and followed), resumed, rebuilt, as_of ------------------------------------


class TestTraceStoreKit(ProjectionKit):
    """The projection kit run on the trace store."""

    def make_projection(self) -> Projection[Any]:
        return TraceStore()

    def append_events(self, log: EventLog) -> AsyncIterator[object]:
        return script(generate(11))(log)


class TestTaskHistoryKit(ProjectionKit):
    """The projection kit run on the task history."""

    def make_projection(self) -> Projection[Any]:
        return TaskHistory()

    def append_events(self, log: EventLog) -> AsyncIterator[object]:
        return script(generate(12))(log)


@pytest.mark.parametrize("name", PROJECTIONS)
async def test_live_equals_rebuilt(conn: Connection, plan: LogPlan, name: str) -> None:
    result = await check_live_equals_rebuilt(conn.log, PROJECTIONS[name], script(plan, every=2),
                                             checkpoint_every=10)
    assert result.catch_ups == len(plan.ops) // 2
    assert set(result.digests.values()) == {result.digest}
    reference = await rebuilt(conn.log, PROJECTIONS[name]())
    assert (reference.digest, reference.applied) == (result.digest, result.applied)
    expected_applied = sum(a.summaries if name == "trace_store" else a.finished for a in plan.attempts)
    assert result.applied == expected_applied


async def test_follow_picks_up_appends_made_after_it_started_and_stops_when_idle(
        conn: Connection, plan: LogPlan) -> None:
    runner = ProjectionRunner(conn.log, TraceStore(), checkpoint_every=25)
    stop = asyncio.Event()
    follower = asyncio.create_task(runner.follow(until=stop))
    await write(conn.log, plan, slice(0, len(plan.ops) // 2))
    middle = await last_position(conn.log, runner.projection)
    await wait_until(lambda: runner.position >= middle, 20, "the follower to reach the middle")
    await write(conn.log, plan, slice(len(plan.ops) // 2, None))
    end = await last_position(conn.log, runner.projection)
    await wait_until(lambda: runner.position >= end, 20, "the follower to reach the end")
    stop.set()  # nothing more arrives: follow must still return
    await asyncio.wait_for(follower, 10)
    status = await runner.status()
    assert status is not None and (status.seq, status.index, status.digest) == (*runner.position, runner.digest)
    reference = await rebuilt(conn.log, TraceStore())
    assert (runner.digest, runner.applied) == (reference.digest, reference.applied)


async def test_follow_returns_when_until_is_already_set_on_an_empty_log(conn: Connection) -> None:
    runner = ProjectionRunner(conn.log, TaskHistory())
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(runner.follow(until=stop), 10)
    assert runner.position == START and runner.state == {}


async def test_cancelled_follow_checkpoints_where_it_stopped(conn: Connection, written: LogPlan) -> None:
    runner = ProjectionRunner(conn.log, TaskHistory(), checkpoint_every=1000)
    follower = asyncio.create_task(runner.follow())
    end = await last_position(conn.log, runner.projection)
    await wait_until(lambda: runner.position >= end, 20, "the follower to reach the end")
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    status = await runner.status()
    assert status is not None
    assert (status.seq, status.index, status.applied, status.digest) == (*end, runner.applied, runner.digest)
    resumed = ProjectionRunner(conn.log, TaskHistory())
    assert await resumed.load() == end and resumed.digest == runner.digest


class _Leaky(TraceStore):
    """A broken projection: its fold depends on how often any instance folded before."""

    name: ClassVar[str] = "leaky"
    calls: ClassVar[int] = 0

    def fold(self, state: dict[str, AttemptTrace], record: Record) -> dict[str, AttemptTrace]:
        _Leaky.calls += 1
        state = super().fold(state, record)
        if isinstance(record.event, AttemptFinished):
            for trace in state.values():
                trace.reason = str(_Leaky.calls)
        return state


async def test_kit_catches_a_projection_whose_fold_is_not_deterministic(conn: Connection, plan: LogPlan) -> None:
    with pytest.raises(ProjectionMismatch, match="state differs from the rebuilt one"):
        await check_live_equals_rebuilt(conn.log, _Leaky, script(plan))


# --- exactly once --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROJECTIONS)
async def test_catch_up_twice_changes_nothing(conn: Connection, written: LogPlan, name: str) -> None:
    runner = ProjectionRunner(conn.log, PROJECTIONS[name]())
    await runner.catch_up()
    digest, applied, position = runner.digest, runner.applied, runner.position
    assert applied > 0
    await runner.catch_up()
    assert (runner.digest, runner.applied, runner.position) == (digest, applied, position)
    for record in await records(conn.log, runner.projection.reads):  # what its reads hand it
        assert runner.apply(record) is False
    assert (runner.digest, runner.applied, runner.position) == (digest, applied, position)
    await check_exactly_once(conn.log, PROJECTIONS[name])


async def test_apply_refuses_positions_at_or_before_the_runner_position(conn: Connection, written: LogPlan) -> None:
    log_records = await records(conn.log)
    framed = next(r for r in log_records if r.index == 2)
    frame = [r for r in log_records if r.seq == framed.seq]
    before = [r for r in log_records if r.position < frame[0].position]
    runner = ProjectionRunner(conn.log, TraceStore())
    for record in [*before, *frame[:3]]:
        assert runner.apply(record) is True
    assert runner.position == (framed.seq, 2)
    digest, applied = runner.digest, runner.applied
    for record in [*before, *frame[:3]]:  # earlier messages and earlier events of the same frame
        assert runner.apply(record) is False
    assert (runner.digest, runner.applied, runner.position) == (digest, applied, (framed.seq, 2))
    if len(frame) > 3:
        assert runner.apply(frame[3]) is True
        assert runner.position == (framed.seq, 3)


@pytest.mark.parametrize("name", PROJECTIONS)
async def test_rereading_a_range_applies_only_what_is_new(conn: Connection, written: LogPlan, name: str) -> None:
    last = await conn.log.last_seq()
    runner = ProjectionRunner(conn.log, PROJECTIONS[name]())
    await runner.catch_up(stop=last // 2)
    at = runner.position
    applied_then = runner.applied
    log_records = await records(conn.log)
    results = [runner.apply(r) for r in log_records]
    assert results == [r.position > at for r in log_records]
    reference = await rebuilt(conn.log, PROJECTIONS[name]())
    assert (runner.digest, runner.applied) == (reference.digest, reference.applied)
    assert applied_then < runner.applied


async def test_retried_appends_are_deduplicated_and_never_folded_twice(conn: Connection, written: LogPlan) -> None:
    runner = ProjectionRunner(conn.log, TraceStore())
    await runner.catch_up()
    digest, applied, last = runner.digest, runner.applied, await conn.log.last_seq()
    retried = [op for op in written.ops if op[0] in ("singles", "frames", "event")][-10:]
    for op in retried:  # the same keys: the server's duplicate window drops them
        await apply_op(conn.log, op)
    assert await conn.log.last_seq() == last
    await runner.catch_up()
    assert (runner.digest, runner.applied) == (digest, applied)


# --- checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROJECTIONS)
async def test_checkpoint_resume_equals_a_full_rebuild(conn: Connection, plan: LogPlan, name: str) -> None:
    half = len(plan.ops) // 2
    await write(conn.log, plan, slice(0, half))
    first = ProjectionRunner(conn.log, PROJECTIONS[name](), checkpoint_every=7)
    await first.catch_up()
    status = await first.status()
    assert status is not None
    assert (status.seq, status.index, status.applied, status.digest) == (
        *first.position, first.applied, first.digest)

    second = ProjectionRunner(conn.log, PROJECTIONS[name](), checkpoint_every=7)
    assert await second.load() == first.position
    assert second.resumed_from == first.position
    assert (second.digest, second.applied) == (first.digest, first.applied)

    await write(conn.log, plan, slice(half, None))
    await second.catch_up()
    assert second.applied > first.applied
    reference = await rebuilt(conn.log, PROJECTIONS[name]())
    assert (second.digest, second.applied, second.position) == (
        reference.digest, reference.applied, reference.position)


async def test_resume_from_a_mid_log_checkpoint(conn: Connection, written: LogPlan) -> None:
    last = await conn.log.last_seq()
    first = ProjectionRunner(conn.log, TraceStore())
    await first.catch_up(stop=last // 3)
    second = ProjectionRunner(conn.log, TraceStore())
    assert await second.load() == first.position
    assert 0 < second.position[0] <= last // 3
    await second.catch_up()
    reference = await rebuilt(conn.log, TraceStore())
    assert (second.digest, second.applied) == (reference.digest, reference.applied)


class _TraceStoreNext(TraceStore):
    version: ClassVar[int] = TraceStore.version + 1


async def test_checkpoint_of_another_version_is_ignored(conn: Connection, written: LogPlan) -> None:
    v1 = ProjectionRunner(conn.log, TraceStore())
    await v1.catch_up()
    v2 = ProjectionRunner(conn.log, _TraceStoreNext())
    assert await v2.load() == START
    assert v2.resumed_from is None and v2.state == {} and v2.applied == 0
    await v2.catch_up()  # from scratch, then checkpointed as the next version
    assert (v2.digest, v2.applied) == (v1.digest, v1.applied)
    status = await v2.status()
    assert status is not None and status.version == TraceStore.version + 1
    again = ProjectionRunner(conn.log, TraceStore())
    assert await again.load() == START  # and now the older version's runner ignores that one


async def _overwrite_snapshot(conn: Connection, cp: Checkpoint, data: bytes) -> None:
    store = await conn.js.object_store(BLOB_STORE)
    await store.put(cp.snapshot, data)


async def _delete_snapshot(conn: Connection, cp: Checkpoint) -> None:
    store = await conn.js.object_store(BLOB_STORE)
    await store.delete(cp.snapshot)


async def _garbage_checkpoint(conn: Connection, cp: Checkpoint) -> None:
    kv = await conn.js.key_value(POSITIONS_BUCKET)
    await kv.put(TraceStore.name, b"\xc1 not a checkpoint")


CORRUPTIONS: dict[str, Callable[[Connection, Checkpoint], Awaitable[None]]] = {
    "garbage bytes": lambda conn, cp: _overwrite_snapshot(conn, cp, b"\x00\xffgarbage" * 100),
    "wrong but decodable state": lambda conn, cp: _overwrite_snapshot(conn, cp, TraceStore().encode({})),
    "torn snapshot": lambda conn, cp: _overwrite_snapshot(conn, cp, b"\x8f"),
    "missing snapshot": _delete_snapshot,
    "garbage checkpoint record": _garbage_checkpoint,
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_corrupted_checkpoint_is_not_trusted_and_gets_repaired(
        conn: Connection, written: LogPlan, corruption: str) -> None:
    first = ProjectionRunner(conn.log, TraceStore(), checkpoint_every=50)
    await first.catch_up()
    cp = await first.status()
    assert cp is not None
    await CORRUPTIONS[corruption](conn, cp)

    second = ProjectionRunner(conn.log, TraceStore())
    assert await second.load() == START
    assert second.resumed_from is None and second.state == {} and second.applied == 0
    await second.catch_up()
    assert (second.digest, second.applied, second.position) == (first.digest, first.applied, first.position)

    third = ProjectionRunner(conn.log, TraceStore())
    assert await third.load() == first.position  # the catch-up rewrote a sound checkpoint
    assert third.digest == first.digest


class _Padded(Projection[list[str]]):
    """A state that grows by a kilobyte an event: what makes fixed-count checkpoints quadratic."""

    name: ClassVar[str] = "padded"
    state_type = list[str]

    def initial(self) -> list[str]:
        return []

    def fold(self, state: list[str], record: Record) -> list[str]:
        state.append(record.type.ljust(1000, "."))
        return state


class _Counting(ProjectionRunner[list[str]]):
    """A runner that counts the checkpoints it writes."""

    checkpoints = 0

    async def checkpoint(self) -> Checkpoint:
        self.checkpoints += 1
        return await super().checkpoint()


async def test_a_runner_not_told_how_often_spaces_checkpoints_by_the_states_size(conn: Connection) -> None:
    subject = trace_subject("padded", 0, "t", 0)
    await conn.log.append_batch([Entry(subject, HookRecord(stage="emitted", step=n, event=StepStart(step=n)),
                                       key=f"{subject}#{n}") for n in range(300)],
                                frame_size=16)
    exact = _Counting(conn.log, _Padded(), checkpoint_every=10)
    await exact.rebuild()
    assert exact.checkpoints == 300 // 10 + 1  # told: every 10 events, and at the end
    spaced = _Counting(conn.log, _Padded())
    spaced.checkpoint_every = 10  # the floor; not told, so spaced by the snapshot's size
    await spaced.rebuild()
    # The first checkpoint (10 events, ~10 kB) defers the next to ~10 kB / 32 = ~320 events: only the final one.
    assert spaced.checkpoints == 2
    assert (spaced.digest, spaced.applied, spaced.position) == (exact.digest, exact.applied, exact.position)
    status = await spaced.status()
    assert status is not None and (status.seq, status.index, status.digest) == (*spaced.position, spaced.digest)


async def test_reset_forgets_the_checkpoint(conn: Connection, written: LogPlan) -> None:
    runner = ProjectionRunner(conn.log, TaskHistory())
    await runner.catch_up()
    await runner.reset()
    assert await runner.status() is None
    assert (runner.position, runner.applied, runner.state) == (START, 0, {})
    assert await ProjectionRunner(conn.log, TaskHistory()).load() == START


# --- time travel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROJECTIONS)
async def test_as_of_equals_catching_up_to_the_same_sequence(conn: Connection, written: LogPlan, name: str) -> None:
    last = await conn.log.last_seq()
    seqs = sorted({1, 2, last // 5, last // 3, last // 2, 2 * last // 3, last - 1, last, *written_seqs(written)})
    await check_time_travel(conn.log, PROJECTIONS[name], seqs)
    runner = ProjectionRunner(conn.log, PROJECTIONS[name]())
    for seq in seqs[:4]:
        await runner.catch_up(stop=seq)
        assert msgspec.msgpack.encode(await runner.as_of(seq)) == msgspec.msgpack.encode(runner.state)


def written_seqs(plan: LogPlan) -> list[int]:
    """Sequences around the garbage messages: as_of must step over them too."""
    return [s for g in plan.garbage[-3:] for s in (g.seq - 1, g.seq) if s > 0]


async def test_as_of_before_an_attempt_finished_shows_it_running(conn: Connection, written: LogPlan) -> None:
    finishes = [r for r in await records(conn.log) if isinstance(r.event, AttemptFinished) and r.index == 0]
    assert finishes
    runner = ProjectionRunner(conn.log, TraceStore())
    history = ProjectionRunner(conn.log, TaskHistory())
    for record in finishes[:8]:
        event = record.event
        assert isinstance(event, AttemptFinished)
        key = attempt_key(event.run_id, event.round, event.task_id, event.attempt)
        plan = written.attempt(key)
        before = await runner.as_of(record.seq - 1)
        assert before[key].outcome == "running"
        assert before[key].status == ""
        after = await runner.as_of(record.seq)
        assert after[key].outcome == plan.outcome
        assert after[key].steps == plan.steps
        rk = round_key(event.run_id, event.round, event.task_id)
        then = await history.as_of(record.seq - 1)
        assert str(event.attempt) not in (then[rk].attempts if rk in then else {})
        assert (await history.as_of(record.seq))[rk].attempts[str(event.attempt)] is plan.verdict


async def test_as_of_leaves_the_checkpoint_and_state_alone(conn: Connection, written: LogPlan) -> None:
    runner = ProjectionRunner(conn.log, TraceStore())
    await runner.catch_up()
    kv = await conn.js.key_value(POSITIONS_BUCKET)
    entry = await kv.get(TraceStore.name)
    digest, position = runner.digest, runner.position
    early = await runner.as_of(5)
    assert len(early) < len(runner.state)
    assert (runner.digest, runner.position) == (digest, position)
    again = await kv.get(TraceStore.name)
    assert (again.revision, again.value) == (entry.revision, entry.value)
    restored = ProjectionRunner(conn.log, TraceStore())
    assert await restored.load() == position
    assert restored.digest == digest


async def stopped_at(log: EventLog, projection: Projection[Any], seq: int) -> ProjectionRunner[Any]:
    """A runner that folded from sequence 1 up to ``seq`` (a rebuild stopped there), checkpointing nothing."""
    runner: ProjectionRunner[Any] = ProjectionRunner(log, projection)
    await runner.catch_up(stop=seq, checkpoint=False)
    return runner


@pytest.mark.parametrize("name", PROJECTIONS)
async def test_as_of_cold_and_from_a_snapshot_equals_a_rebuild_stopped_there(conn: Connection, written: LogPlan,
                                                                             name: str) -> None:
    proj = PROJECTIONS[name]()
    middle = await conn.log.last_seq() // 2 + 1
    every = max(1, middle // 3)
    boundary = middle // every * every
    stopped = await stopped_at(conn.log, proj, middle)
    travel: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj, snapshot_every=every)
    assert await Snapshots(conn.log, proj).index() == []
    # Cold: no snapshot yet, so as_of folds from sequence 1 and stores one at the last multiple before it.
    assert state_digest(await travel.as_of(middle)) == stopped.digest
    [ref] = await Snapshots(conn.log, proj).index()
    assert ref.seq == boundary and ref.digest == (await stopped_at(conn.log, proj, boundary)).digest
    # Warm: as_of starts from that snapshot and folds only what lies after it.
    assert state_digest(await travel.as_of(middle)) == stopped.digest
    warm = await travel.fold_as_of(middle)
    assert (warm.digest, warm.start_kind, warm.start, warm.written) == (stopped.digest, "snapshot", boundary, 0)
    assert warm.folded == stopped.applied - ref.applied
    # A point past the snapshot folds from it too; neither the runner nor any checkpoint changed.
    last = await conn.log.last_seq()
    late = await travel.fold_as_of(last)
    assert late.digest == (await stopped_at(conn.log, proj, last)).digest and late.start_kind == "snapshot"
    assert (travel.position, travel.applied, travel.state) == (START, 0, proj.initial())
    assert await travel.status() is None


@pytest.mark.parametrize("blob", ["torn", "another state"])
async def test_as_of_skips_a_snapshot_that_does_not_verify(conn: Connection, written: LogPlan, blob: str) -> None:
    proj = TraceStore()
    last = await conn.log.last_seq()
    every = max(1, last // 4)
    travel: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj, snapshot_every=every)
    await travel.as_of(2 * every)
    await travel.as_of(3 * every)
    assert [r.seq for r in await Snapshots(conn.log, proj).index()] == [2 * every, 3 * every]
    store = await conn.js.object_store(BLOB_STORE)
    bad = b"\x00torn" if blob == "torn" else proj.encode(proj.initial())  # decodes, but to the wrong digest
    await store.put(snapshot_name(proj, 3 * every), bad)
    fold = await travel.fold_as_of(3 * every)
    assert (fold.start_kind, fold.start) == ("snapshot", 2 * every)  # the bad one skipped for the sound one
    assert fold.digest == (await stopped_at(conn.log, proj, 3 * every)).digest
    assert fold.written == 1  # ... and stored again, sound: the next fold starts from it
    assert (await travel.fold_as_of(3 * every)).start == 3 * every


async def test_as_of_starts_from_the_runner_or_its_checkpoint_when_nearer(conn: Connection,
                                                                         written: LogPlan) -> None:
    last = await conn.log.last_seq()
    runner = ProjectionRunner(conn.log, TaskHistory(), snapshot_every=last + 1)  # no as-of snapshot at all
    await runner.catch_up(stop=last // 2)
    kv = await conn.js.key_value(POSITIONS_BUCKET)
    entry = await kv.get(TaskHistory.name)
    expected = (await stopped_at(conn.log, TaskHistory(), last - 1)).digest
    mine = await runner.fold_as_of(last - 1)  # the runner itself is at last // 2: a copy of its state
    assert (mine.start_kind, mine.start, mine.written, mine.digest) == ("runner", last // 2, 0, expected)
    assert runner.position[0] == last // 2
    other = ProjectionRunner(conn.log, TaskHistory(), snapshot_every=last + 1)  # nothing in memory: the checkpoint
    fold = await other.fold_as_of(last - 1)
    assert (fold.start_kind, fold.start, fold.written, fold.digest) == ("checkpoint", last // 2, 0, expected)
    before = await runner.fold_as_of(last // 2 - 1)  # runner and checkpoint are past this point: not a start
    assert before.start_kind == "start"
    assert before.digest == (await stopped_at(conn.log, TaskHistory(), last // 2 - 1)).digest
    again = await kv.get(TaskHistory.name)
    assert (again.revision, again.value) == (entry.revision, entry.value)
    with pytest.raises(AsOfError, match=f"position {last + 1} is not on HX_TRACE"):
        await runner.as_of(last + 1)


# --- the trace store -------------------------------------------------------------------------------


async def test_trace_store_summarises_each_attempt(conn: Connection, written: LogPlan) -> None:
    runner = await rebuilt(conn.log, TraceStore())
    state: dict[str, AttemptTrace] = runner.state
    assert set(state) == {a.key for a in written.attempts}  # run- and round-level events make no attempt
    summaries = [r for r in await records(conn.log) if type(r.event).CHANNEL]
    assert runner.applied == len(summaries) == sum(a.summaries for a in written.attempts)
    for plan in written.attempts:
        trace = state[plan.key]
        assert (trace.run, trace.round, trace.task, trace.attempt) == (plan.run, plan.round, plan.task,
                                                                         plan.attempt)
        assert trace.steps == (plan.steps if plan.finished else 0)  # from attempt.finished
        assert trace.outcome == plan.outcome
        assert trace.score == plan.score
        assert trace.status == (plan.status or "")
        assert trace.reason == ("sandbox lost" if plan.status == "infra_failure" else "")
        assert trace.verifier_passed == (plan.verifier[0] if plan.verifier is not None else None)
        assert (trace.harness_digest, trace.model) == (f"h{plan.round}", f"model-{plan.attempt % 2}")
        own = [r.seq for r in summaries if r.subject == plan.subject]
        assert (trace.first_seq, trace.last_seq) == (own[0], own[-1])


async def test_trace_store_finds_each_attempts_events_on_the_log(conn: Connection, written: LogPlan) -> None:
    runner = await rebuilt(conn.log, TraceStore())
    for key, trace in runner.state.items():
        plan = written.attempt(key)
        # A finished attempt's events lie between its first and last summary message; a running one's go on.
        stop = trace.last_seq if plan.finished else None
        found = [r async for r in conn.log.read(start=trace.first_seq, stop=stop, subjects=trace.filters)]
        assert [r.event for r in found] == plan.events(), key
        assert {r.subject for r in found} <= {plan.subject, *(f"{plan.subject}.{c}" for c in
                                                               ("started", "score", "finished"))}


async def test_trace_store_state_does_not_grow_with_an_attempts_events(conn: Connection) -> None:
    sizes = {}
    for steps in (10, 1000):
        attempt = AttemptPlan("size", 0, f"steps-{steps}", 0, steps, "completed", True, (True, 1.0), 1.0)
        events = attempt.events()
        await conn.log.append_batch([Entry(attempt.subject, e, key=f"{attempt.subject}#{i}")
                                     for i, e in enumerate(events)], frame_size=64)
        runner = await rebuilt(conn.log, TraceStore())
        sizes[len(events)] = len(msgspec.msgpack.encode(runner.state[attempt.key]))
        assert runner.state[attempt.key].steps == steps
    (few, small), (many, large) = sorted(sizes.items())
    assert many > 80 * few
    assert abs(large - small) <= 8, sizes  # a few more digits in a sequence number, not an entry per event


async def test_runner_hands_a_projection_only_its_reads_and_reaches_the_end(conn: Connection) -> None:
    subject = trace_subject("narrow", 0, "t", 0)
    call = ToolCall(id="c", name="look", input={})

    def step(n: int) -> list[Event]:
        return [HookRecord(stage="emitted", step=n, event=StepStart(step=n)), ToolInvoked(step=n, call=call)]

    await conn.log.append_batch([Entry(subject, e, key=f"{subject}#{i}") for i, e in enumerate(step(1))],
                                frame_size=8)
    # A frame whose hook.record body is corrupt: a reader decoding it would lose the whole frame.
    bodies: list[EncodedEvent] = [encoded(e) for e in step(2)]
    bodies[0] = (bodies[0][0], bodies[0][1], b"\x01", bodies[0][3])  # msgpack, but no hook record
    await (await conn.log.send_frame(subject, bodies, key=f"{subject}#corrupt")).result()
    await conn.log.append(subject, AttemptFinished(run_id="narrow", round=0, task_id="t", attempt=0, passed=True,
                                                   steps=2))
    await conn.log.append_batch([Entry(subject, e, key=f"{subject}#tail{i}") for i, e in enumerate(step(3)[:1])])
    last = await conn.log.last_seq()

    class Seen(Projection[list[str]]):
        name: ClassVar[str] = "seen"
        reads = frozenset({ToolInvoked.TYPE, AttemptFinished.TYPE})
        state_type = list[str]

        def initial(self) -> list[str]:
            return []

        def fold(self, state: list[str], record: Record) -> list[str]:
            state.append(record.type)
            return state

    quarantined = conn.log.quarantine.count
    runner = ProjectionRunner(conn.log, Seen())
    await runner.catch_up()
    assert runner.state == [ToolInvoked.TYPE, ToolInvoked.TYPE, AttemptFinished.TYPE]
    assert conn.log.quarantine.count == quarantined  # the corrupt body was never decoded
    assert runner.position == (last, 0) and runner.applied == 3  # the last message holds none of its types
    status = await runner.status()
    assert status is not None and (status.seq, status.index) == (last, 0)


async def test_undecodable_messages_are_quarantined_and_skipped(conn: Connection, written: LogPlan) -> None:
    quarantined = conn.log.quarantine.count
    runner = await rebuilt(conn.log, EveryEvent())  # a fold of every event reads every message
    assert conn.log.quarantine.count - quarantined == len(written.garbage)
    assert sorted(q.seq for q in conn.log.quarantine.records) == sorted(g.seq for g in written.garbage)
    filed = {r.seq for r in await records(conn.log)}
    assert filed.isdisjoint(g.seq for g in written.garbage)
    assert runner.applied == sum(len(a.events()) for a in written.attempts) + written.run_level
    # The log ends with a garbage message: the runner's position still covers it, the trace store's too.
    assert runner.position == (written.garbage[-1].seq, 0) == (await conn.log.last_seq(), 0)
    assert (await rebuilt(conn.log, TraceStore())).position == runner.position


async def test_fold_all_without_a_log_equals_the_runner(conn: Connection, written: LogPlan) -> None:
    log_records = await records(conn.log)
    for name, factory in PROJECTIONS.items():
        runner = await rebuilt(conn.log, factory())
        assert msgspec.msgpack.encode(fold_all(factory(), log_records)) == msgspec.msgpack.encode(
            runner.state), name


# --- the task history ------------------------------------------------------------------------------


async def test_task_history_records_each_verdict_per_task_and_round(conn: Connection, written: LogPlan) -> None:
    runner = await rebuilt(conn.log, TaskHistory())
    state: dict[str, TaskRound] = runner.state
    expected = written.rounds()
    assert set(state) == set(expected)
    for key, attempts in expected.items():
        entry = state[key]
        assert (entry.run, entry.round, entry.task) == (attempts[0].run, attempts[0].round, attempts[0].task)
        assert entry.attempts == {str(a.attempt): a.verdict for a in attempts}
        assert entry.infra_failures == sum(a.status == "infra_failure" for a in attempts)
        assert entry.n == len(attempts)
        assert entry.passes == sum(a.verdict for a in attempts)
        assert entry.solved is any(a.verdict for a in attempts)
    # An infrastructure failure that claimed to pass still counts as a failure.
    lucky = [a for a in written.attempts if a.status == "infra_failure" and a.passed]
    assert lucky
    for a in lucky:
        assert state[round_key(a.run, a.round, a.task)].attempts[str(a.attempt)] is False


async def test_task_history_pass_at_k_per_round(conn: Connection, written: LogPlan) -> None:
    runner = await rebuilt(conn.log, TaskHistory())
    state: dict[str, TaskRound] = runner.state
    for run in RUNS:
        for rnd in range(2):
            rounds = TaskHistory.rounds_of(state, run, rnd)
            assert [t.task for t in rounds] == sorted(t.task for t in rounds)
            assert {t.task for t in rounds} == {a.task for a in written.attempts
                                                if a.run == run and a.round == rnd and a.finished}
            for entry in rounds:
                verdicts = [a.verdict for a in written.rounds()[round_key(run, rnd, entry.task)]]
                for k in range(1, len(verdicts) + 1):
                    assert entry.pass_at(k) == pytest.approx(float(brute_force_pass_at_k(verdicts, k)))
                with pytest.raises(ValueError, match="needs at least"):
                    entry.pass_at(len(verdicts) + 1)


def _finished(attempt: int, *, passed: bool, status: AttemptStatus = "completed", seq: int = 1) -> Record:
    event = AttemptFinished(run_id="r", round=0, task_id="t", attempt=attempt, passed=passed, status=status)
    return Record(seq, 0, trace_subject("r", 0, "t", attempt), event.TYPE, 1, 0, event)


def test_a_replaced_verdict_replaces_its_infra_failure_mark() -> None:
    history = TaskHistory()
    state = fold_all(history, [_finished(0, passed=False, status="infra_failure", seq=1),
                               _finished(1, passed=True, seq=2)])
    assert state["r/0/t"].infra_failures == 1 and state["r/0/t"].attempts == {"0": False, "1": True}
    state = history.fold(state, _finished(0, passed=True, seq=3))  # the retried attempt passed
    assert state["r/0/t"].infra_failures == 0 and state["r/0/t"].passes == 2
    state = history.fold(state, _finished(1, passed=True, status="infra_failure", seq=4))
    assert state["r/0/t"].infra_failures == 1 and state["r/0/t"].attempts == {"0": True, "1": False}
    state = history.fold(state, _finished(1, passed=False, status="infra_failure", seq=5))
    assert state["r/0/t"].infra_failures == 1


# --- pass@k ----------------------------------------------------------------------------------------


def brute_force_pass_at_k(verdicts: list[bool], k: int) -> Fraction:
    """The probability that a uniformly drawn k-subset of the attempts holds a pass."""
    subsets = list(itertools.combinations(verdicts, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_equals_the_brute_force_probability(n: int) -> None:
    for c in range(n + 1):
        verdicts = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(verdicts, k)), abs=1e-12)
    assert pass_at_k(n, 0, 1) == 0.0
    assert pass_at_k(n, n, 1) == 1.0
    assert pass_at_k(n, 1, n) == 1.0


@pytest.mark.parametrize(("n", "c", "k", "message"), [
    (0, 0, 1, "n > 0 and k > 0, got n=0, k=1"),
    (-2, 0, 1, "n > 0 and k > 0, got n=-2, k=1"),
    (3, 1, 0, "n > 0 and k > 0, got n=3, k=0"),
    (3, 1, -1, "n > 0 and k > 0, got n=3, k=-1"),
    (3, 1, 4, "pass@4 needs at least 4 attempts, got 3"),
    (3, 4, 1, "between 0 and n=3 passes, got c=4"),
    (3, -1, 1, "between 0 and n=3 passes, got c=-1"),
])
def test_pass_at_k_rejects_impossible_arguments(n: int, c: int, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        pass_at_k(n, c, k)
