"""The projection kit: checks every projection must pass, reusable by each one's tests.

As eventsourcing ships abstract test cases for its recorders, hx ships this kit for its
projections. Give it a factory for the projection and an *append script* (an async
generator that appends events to the log and yields wherever a live reader should
catch up), and it checks that every way of maintaining the projection agrees:

- a runner catching up between appends (``polled``),
- a runner following the log as it grows (``followed``),
- a runner restored from the polled runner's checkpoint and caught up (``resumed``),
- a runner that rebuilds the whole log afresh (``rebuilt``), and ``as_of`` the end,

all end with the same ``state_digest`` and the same count of applied events. Each runner
checkpoints under its own name (``<name>-kit-<role>``), so the kit never touches a real
runner's checkpoint. A failed check raises ``ProjectionMismatch`` (an ``AssertionError``).

In a pytest module, subclass ``ProjectionKit`` in a ``Test...`` class to get the checks
as tests (they use the ``nats_url`` fixture)::

    class TestTaskHistoryKit(ProjectionKit):
        def make_projection(self) -> Projection[Any]:
            return TaskHistory()

        async def append_events(self, log: EventLog) -> AsyncIterator[object]:
            for n in range(3):
                await log.append(trace_subject("r", 0, "t", n), AttemptFinished(
                    run_id="r", round=0, task_id="t", attempt=n, passed=n == 2))
                yield n
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from projections.base import Projection
from projections.runner import START, LogPosition, ProjectionRunner
from projections.snapshots import Snapshots
from schemas.envelope import Record
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog

S = TypeVar("S")

AppendScript = Callable[[EventLog], AsyncIterator[object]]
"""Appends events to the log, yielding wherever a live reader should catch up."""
ProjectionFactory = Callable[[], Projection[Any]]
"""Makes a fresh instance of the projection under test."""


class ProjectionMismatch(AssertionError):
    """Two ways of maintaining a projection disagree."""


@dataclass(frozen=True)
class KitResult:
    """What the live-versus-rebuilt check saw (all roles agreed on it)."""

    digest: str
    position: LogPosition
    """The rebuilt runner's position."""
    applied: int
    catch_ups: int
    """How often the polled runner caught up while events were appended."""
    digests: dict[str, str]
    """Each role's final digest."""


class _Renamed(Projection[S]):
    """A projection delegating to another; subclasses made by ``isolated`` set the names."""

    def __init__(self, inner: Projection[S]) -> None:
        self.inner = inner

    def initial(self) -> S:
        """The inner projection's initial state."""
        return self.inner.initial()

    def fold(self, state: S, record: Record) -> S:
        """The inner projection's fold."""
        return self.inner.fold(state, record)

    def encode(self, state: S) -> bytes:
        """The inner projection's snapshot encoding."""
        return self.inner.encode(state)

    def decode(self, data: bytes) -> S:
        """The inner projection's snapshot decoding."""
        return self.inner.decode(data)


def isolated(projection: Projection[S], role: str) -> Projection[S]:
    """The same projection checkpointing under ``<name>-kit-<role>``, so runners can share a log."""
    cls = type(projection)
    attrs = {"name": f"{cls.name}-kit-{role}", "version": cls.version, "stream": cls.stream,
             "reads": cls.reads, "subjects": cls.subjects, "state_type": cls.state_type}
    renamed = type(f"{cls.__name__}[{role}]", (_Renamed,), attrs)
    result: Projection[S] = renamed(projection)
    return result


def fold_all(projection: Projection[S], records: Sequence[Record]) -> S:
    """Fold records (in log order) into a fresh state, without a log: for pure fold tests."""
    state = projection.initial()
    reads = projection.reads
    for record in records:
        if not reads or record.type in reads:
            state = projection.fold(state, record)
    return state


async def last_position(log: EventLog, projection: Projection[Any]) -> LogPosition:
    """The position of the last decodable event the projection's runner would read."""
    last = START
    async for record in log.read(projection.stream, subjects=projection.subjects, types=projection.reads):
        last = record.position
    return last


async def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; raise ``ProjectionMismatch`` naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise ProjectionMismatch(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.005)


def _first_difference(expected: Any, actual: Any) -> str:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in actual:
                return f"key {key!r} missing"
            if key not in expected:
                return f"unexpected key {key!r}"
            if expected[key] != actual[key]:
                return f"key {key!r}: expected {expected[key]!r}, got {actual[key]!r}"
    return f"expected {expected!r:.300}, got {actual!r:.300}"


def assert_same_state(expected: ProjectionRunner[Any], actual: ProjectionRunner[Any], role: str,
                      *, applied: bool = True) -> None:
    """Raise ``ProjectionMismatch`` unless two runners hold equal states (and applied counts)."""
    if expected.digest != actual.digest:
        raise ProjectionMismatch(f"{role} state differs from the rebuilt one: "
                                 f"{_first_difference(expected.state, actual.state)}")
    if applied and expected.applied != actual.applied:
        raise ProjectionMismatch(f"{role} runner applied {actual.applied} events, the rebuilt one "
                                 f"{expected.applied}")


async def check_live_equals_rebuilt(log: EventLog, projection_factory: ProjectionFactory,
                                    append_events: AppendScript, *, checkpoint_every: int = 64,
                                    timeout: float = 30.0) -> KitResult:
    """Append with ``append_events`` while maintaining the projection live; check it equals a rebuild.

    Runs the polled, followed, resumed, rebuilt and as-of roles described in the module
    docstring and raises ``ProjectionMismatch`` naming the first role that disagrees.
    """
    polled = ProjectionRunner(log, isolated(projection_factory(), "polled"), checkpoint_every=checkpoint_every)
    followed = ProjectionRunner(log, isolated(projection_factory(), "followed"),
                                checkpoint_every=checkpoint_every)
    stop = asyncio.Event()
    follower = asyncio.create_task(followed.follow(until=stop))
    catch_ups = 0
    try:
        async for _ in append_events(log):
            await polled.catch_up()
            catch_ups += 1
        await polled.catch_up()
        end = await last_position(log, polled.projection)
        await wait_until(lambda: followed.position >= end or follower.done(), timeout,
                         f"the following runner to reach {end} (it is at {followed.position})")
    finally:
        stop.set()
        await asyncio.wait_for(follower, timeout)

    rebuilt = ProjectionRunner(log, isolated(projection_factory(), "rebuilt"))
    await rebuilt.rebuild()
    resumed = ProjectionRunner(log, isolated(projection_factory(), "polled"))
    await resumed.load()
    if resumed.position != polled.position:
        raise ProjectionMismatch(f"resumed at {resumed.position}, the polled runner checkpointed "
                                 f"{polled.position}")
    await resumed.catch_up()
    as_of = ProjectionRunner(log, projection_factory())
    # A runner with no checkpoint of its own: its as_of is a fold, not the load of a checkpoint at the end.
    travel = ProjectionRunner(log, isolated(projection_factory(), "as_of"))
    as_of.state = await travel.as_of(await log.last_seq(rebuilt.projection.stream))
    await Snapshots(log, travel.projection).clear()

    assert_same_state(rebuilt, polled, "polled")
    assert_same_state(rebuilt, followed, "followed")
    assert_same_state(rebuilt, resumed, "resumed")
    assert_same_state(rebuilt, as_of, "as_of", applied=False)
    result = KitResult(rebuilt.digest, rebuilt.position, rebuilt.applied, catch_ups,
                       {"polled": polled.digest, "followed": followed.digest, "resumed": resumed.digest,
                        "rebuilt": rebuilt.digest, "as_of": as_of.digest})
    for runner in (polled, followed, rebuilt):
        await ProjectionRunner(log, runner.projection).reset()  # drop the kit's checkpoints
    return result


async def check_exactly_once(log: EventLog, projection_factory: ProjectionFactory) -> None:
    """Check that folding the log's records again, or catching up again, changes nothing."""
    runner = ProjectionRunner(log, isolated(projection_factory(), "once"))
    await runner.rebuild()
    digest, applied, position = runner.digest, runner.applied, runner.position
    async for record in log.read(runner.projection.stream, subjects=runner.projection.subjects,
                                 types=runner.projection.reads):
        if runner.apply(record):
            raise ProjectionMismatch(f"record at {record.position} applied again at position {position}")
    await runner.catch_up()
    if (runner.digest, runner.applied, runner.position) != (digest, applied, position):
        raise ProjectionMismatch("re-reading the log changed the state, the applied count or the position")
    await ProjectionRunner(log, runner.projection).reset()


async def check_time_travel(log: EventLog, projection_factory: ProjectionFactory,
                            positions: Sequence[int]) -> None:
    """Check that ``as_of(seq)`` equals a runner caught up to ``seq``, for each given sequence.

    The travelling runner has no checkpoint and stores as-of snapshots a quarter of the way
    apart, so the sequences (taken in order) fold both from the start and from snapshots.
    """
    ordered = sorted(positions)
    travel = ProjectionRunner(log, isolated(projection_factory(), "travel"),
                              snapshot_every=max(1, max(ordered, default=0) // 4))
    for seq in ordered:
        stopped = ProjectionRunner(log, isolated(projection_factory(), "stopped"))
        await stopped.catch_up(stop=seq, checkpoint=False)
        travelled = ProjectionRunner(log, projection_factory())
        travelled.state = await travel.as_of(seq)
        assert_same_state(stopped, travelled, f"as_of({seq})", applied=False)
    await Snapshots(log, travel.projection).clear()


class ProjectionKit:
    """Mix into a ``Test...`` class and implement the two methods to run the kit as pytest tests."""

    checkpoint_every = 16
    """How often the kit's live runners checkpoint (small, so resumes start mid-log)."""

    def make_projection(self) -> Projection[Any]:
        """A fresh instance of the projection under test."""
        raise NotImplementedError

    def append_events(self, log: EventLog) -> AsyncIterator[object]:
        """Append a representative log, yielding wherever a live runner should catch up."""
        raise NotImplementedError

    async def test_live_equals_rebuilt(self, nats_url: str) -> None:
        """Polled, followed, resumed, rebuilt and as-of states are identical."""
        async with connect(NatsSettings(url=nats_url)) as conn:
            result = await check_live_equals_rebuilt(conn.log, self.make_projection, self.append_events,
                                                     checkpoint_every=self.checkpoint_every)
            if result.catch_ups == 0:
                raise ProjectionMismatch("append_events yielded nowhere: no live catch-up was exercised")

    async def test_exactly_once(self, nats_url: str) -> None:
        """Re-reading the log changes nothing."""
        async with connect(NatsSettings(url=nats_url)) as conn:
            async for _ in self.append_events(conn.log):
                pass
            await check_exactly_once(conn.log, self.make_projection)

    async def test_time_travel(self, nats_url: str) -> None:
        """``as_of`` equals a runner stopped at the same sequence, at a few sequences."""
        async with connect(NatsSettings(url=nats_url)) as conn:
            async for _ in self.append_events(conn.log):
                pass
            last = await conn.log.last_seq(self.make_projection().stream)
            await check_time_travel(conn.log, self.make_projection,
                                    sorted({max(0, s) for s in (0, 1, last // 3, last // 2, last - 1, last)}))
