"""The event log against a real nats-server: appends, idempotency, concurrency, reads, quarantine."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest

from schemas import (
    FRAME_TYPE,
    HX_COUNT,
    HX_SCHEMA_VERSION,
    HX_TIME,
    HX_TYPE,
    MSG_ID,
    EnvObservation,
    Event,
    HookRecord,
    ProcessorTriggered,
    Record,
    RunStarted,
    StepStart,
    encode_body,
)
from schemas.errors import HxError
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.errors import AppendTimeout, ConcurrencyConflict, LogError, UnacknowledgedAppends
from streams.log import Appended, EventLog
from streams.outgoing import Entry, content_key
from streams.topology import LEARN, LEDGER, TRACE, trace_filter, trace_subject

S1 = trace_subject("run-1", 1, "task.a", 0)
S2 = trace_subject("run-1", 1, "task.b", 0)
S3 = trace_subject("run-2", 1, "task.a", 0)


def started(i: int, task: str = "t") -> EnvObservation:
    """An attempt-level event numbered ``i`` (lifecycle events would have to agree with their subject)."""
    return EnvObservation(step=i, observation=f"{task} at step {i}")


def finished(i: int) -> ProcessorTriggered:
    """A second attempt-level type that goes in the attempt's frames (not one of its summary channels)."""
    return ProcessorTriggered(processor="t", group="t", hook="step_end", step=i, action="changed",
                              reason="passed" if i % 2 == 0 else "")


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


async def read_all(log: EventLog, stream: str = TRACE.name, **kwargs: object) -> list[Record]:
    return [r async for r in log.read(stream, **kwargs)]  # type: ignore[arg-type]


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


# --- single appends ----------------------------------------------------------------------


async def test_connection_is_usable(conn: Connection, nats_url: str) -> None:
    assert conn.url == nats_url
    assert conn.server is None  # a URL was given: no embedded server
    assert conn.nc.is_connected
    assert await conn.log.last_seq() == 0


async def test_append_returns_increasing_sequences(conn: Connection) -> None:
    log = conn.log
    a = await log.append(S1, started(0), key="k0")
    b = await log.append(S2, started(1), key="k1")
    c = await log.append(S1, finished(0), key="k2")
    assert (a, b, c) == (Appended(1, "k0", False), Appended(2, "k1", False), Appended(3, "k2", False))
    assert await log.last_seq() == 3
    assert await log.last_subject_seq(S1) == 3
    assert await log.last_subject_seq(S2) == 2
    assert await log.last_subject_seq(S3) == 0
    records = await read_all(log)
    assert [(r.seq, r.index, r.subject, r.type, r.version) for r in records] == [
        (1, 0, S1, "env.observation", 1), (2, 0, S2, "env.observation", 1), (3, 0, S1, "processor.triggered", 1)]
    assert [r.event for r in records] == [started(0), started(1), finished(0)]


async def test_same_key_twice_is_stored_once(conn: Connection) -> None:
    log = conn.log
    first = await log.append(S1, started(0), key="run-1#0")
    again = await log.append(S1, started(0), key="run-1#0")
    assert first == Appended(1, "run-1#0", False)
    assert again == Appended(1, "run-1#0", True)
    # the key alone decides: a different body under the same key is still the first message
    other = await log.append(S1, started(99), key="run-1#0")
    assert other.duplicate and other.seq == 1
    assert await log.last_seq() == 1
    assert [r.event for r in await read_all(log)] == [started(0)]


async def test_content_key_dedupes_identical_event_and_subject(conn: Connection) -> None:
    log = conn.log
    event = started(0)
    a = await log.append(S1, event)
    b = await log.append(S1, EnvObservation(step=0, observation="t at step 0"))
    assert a.key == content_key(S1, "env.observation", encode_body(event))
    assert not a.duplicate and b.duplicate and b.seq == a.seq and b.key == a.key
    c = await log.append(S2, event)  # another subject: another event
    d = await log.append(S1, started(1))  # another body: another event
    assert not c.duplicate and not d.duplicate
    assert len({a.key, c.key, d.key}) == 3
    assert await log.last_seq() == 3


async def test_wall_clock_time_travels_in_headers_only(conn: Connection) -> None:
    log = conn.log
    before = time.time_ns()
    a = await log.append(S1, started(0), key="a")
    b = await log.append(S1, started(0), key="b")
    after = time.time_ns()
    ma = await conn.js.get_msg(TRACE.name, a.seq)
    mb = await conn.js.get_msg(TRACE.name, b.seq)
    assert ma.data == mb.data == encode_body(started(0))
    assert ma.headers is not None and mb.headers is not None
    assert ma.headers[MSG_ID] == "a" and mb.headers[MSG_ID] == "b"
    assert ma.headers[HX_TYPE] == "env.observation" and ma.headers[HX_SCHEMA_VERSION] == "1"
    ta, tb = int(ma.headers[HX_TIME]), int(mb.headers[HX_TIME])
    assert before <= ta <= tb <= after
    records = await read_all(log)
    assert [r.time_ns for r in records] == [ta, tb]


async def test_append_to_each_stream(conn: Connection) -> None:
    log = conn.log
    await log.append("hx.ledger.edits", RunStarted(run_id="ledger-entry"), key="l1")
    await log.append("hx.learn.updates", RunStarted(run_id="learn-entry"), key="x1")
    assert [r.event for r in await read_all(log, LEDGER.name)] == [RunStarted(run_id="ledger-entry")]
    assert [r.event for r in await read_all(log, LEARN.name)] == [RunStarted(run_id="learn-entry")]
    assert await read_all(log) == []
    assert await log.last_seq(LEDGER.name) == 1


# --- batches -----------------------------------------------------------------------------


async def test_append_batch_stores_all_in_order(conn: Connection) -> None:
    log = conn.log
    subjects = [trace_subject("run-1", 1, f"task-{t}", 0) for t in range(4)]
    entries = [Entry(subjects[i % 4], started(i, task=f"task-{i % 4}"), key=f"run-1#{i}") for i in range(3000)]
    acks = await log.append_batch(entries)
    assert len(acks) == 3000
    assert [a.seq for a in acks] == list(range(1, 3001))
    assert [a.key for a in acks] == [e.key for e in entries]
    assert not any(a.duplicate for a in acks)
    assert log.retried == 0
    assert await log.last_seq() == 3000

    records = await read_all(log)
    assert [r.event for r in records] == [e.event for e in entries]
    assert [r.subject for r in records] == [e.subject for e in entries]
    assert [r.position for r in records] == [(i, 0) for i in range(1, 3001)]
    # spot-check the stored message ids
    for seq in (1, 1500, 3000):
        msg = await conn.js.get_msg(TRACE.name, seq)
        assert msg.headers is not None and msg.headers[MSG_ID] == f"run-1#{seq - 1}"

    # the same batch again (a retried writer) stores nothing new
    again = await log.append_batch(entries)
    assert all(a.duplicate for a in again)
    assert [a.seq for a in again] == [a.seq for a in acks]
    assert await log.last_seq() == 3000


async def test_append_batch_without_keys_uses_content_keys(conn: Connection) -> None:
    log = conn.log
    entries = [Entry(S1, started(i)) for i in range(50)]
    acks = await log.append_batch(entries)
    assert [a.key for a in acks] == [content_key(S1, "env.observation", encode_body(e.event)) for e in entries]
    again = await log.append_batch(entries)
    assert all(a.duplicate for a in again)
    assert await log.last_seq() == 50


async def test_append_batch_of_nothing(conn: Connection) -> None:
    assert await conn.log.append_batch([]) == []
    assert await conn.log.append_batch([], frame_size=10) == []
    assert await conn.log.last_seq() == 0


async def test_frames_pack_events_and_unpack_in_order(conn: Connection) -> None:
    log = conn.log
    runs = [(S1, 130), (S2, 5), (S1, 64), (S3, 1), (S2, 200)]
    entries: list[Entry] = []
    for subject, n in runs:
        for _ in range(n):
            i = len(entries)
            entries.append(Entry(subject, started(i) if i % 3 else finished(i), key=f"e{i}"))
    frame_size = 64
    acks = await log.append_batch(entries, frame_size=frame_size)
    expected_messages = sum(math.ceil(n / frame_size) for _, n in runs)
    assert len(acks) == expected_messages == 3 + 1 + 1 + 1 + 4
    assert await log.last_seq() == expected_messages < len(entries)
    assert acks[0].key == "e0+64" and acks[1].key == "e64+64" and acks[2].key == "e128+2"

    first = await conn.js.get_msg(TRACE.name, 1)
    assert first.headers is not None
    assert first.headers[HX_TYPE] == FRAME_TYPE and first.headers[HX_COUNT] == "64"

    records = await read_all(log)
    assert len(records) == len(entries)
    assert [r.event for r in records] == [e.event for e in entries]
    assert [r.subject for r in records] == [e.subject for e in entries]
    assert [r.type for r in records] == [type(e.event).TYPE for e in entries]
    positions = [r.position for r in records]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # every frame's records are numbered 0..n-1
    by_seq: dict[int, list[int]] = {}
    for r in records:
        by_seq.setdefault(r.seq, []).append(r.index)
    assert sorted(by_seq) == list(range(1, expected_messages + 1))
    assert all(idx == list(range(len(idx))) for idx in by_seq.values())
    assert max(len(idx) for idx in by_seq.values()) == frame_size

    # retrying the framed batch dedupes frame by frame
    again = await log.append_batch(entries, frame_size=frame_size)
    assert all(a.duplicate for a in again)
    assert await log.last_seq() == expected_messages


async def test_frames_filtered_by_type_and_read_from_the_middle(conn: Connection) -> None:
    log = conn.log
    entries = [Entry(S1, started(i) if i % 2 else finished(i), key=f"e{i}") for i in range(10)]
    await log.append_batch(entries, frame_size=4)  # messages: 4 + 4 + 2
    finished_only = await read_all(log, types=["processor.triggered"])
    assert [r.event for r in finished_only] == [finished(i) for i in range(0, 10, 2)]
    assert [r.position for r in finished_only] == [(1, 0), (1, 2), (2, 0), (2, 2), (3, 0)]
    tail = await read_all(log, start=2)
    assert [r.event for r in tail] == [e.event for e in entries[4:]]


# --- optimistic concurrency --------------------------------------------------------------


async def test_conditional_append(conn: Connection) -> None:
    log = conn.log
    a = await log.append(S1, started(0), expected_last_seq=0)  # the subject must be empty
    assert a.seq == 1
    await log.append(S2, started(1))  # other subjects do not move S1's sequence
    assert await log.last_subject_seq(S1) == 1
    b = await log.append(S1, started(2), expected_last_seq=1)
    assert b.seq == 3

    with pytest.raises(ConcurrencyConflict) as info:
        await log.append(S1, started(3), expected_last_seq=1)  # stale: S1 is at 3
    err = info.value
    assert isinstance(err, LogError) and isinstance(err, HxError)
    assert (err.subject, err.expected) == (S1, 1)
    assert S1 in str(err) and "1" in str(err)
    with pytest.raises(ConcurrencyConflict):
        await log.append(S1, started(4), expected_last_seq=0)
    assert await log.last_seq() == 3
    assert [r.event for r in await read_all(log, subjects=[S1])] == [started(0), started(2)]
    # the winner's successor still goes through
    assert (await log.append(S1, started(5), expected_last_seq=3)).seq == 4


async def test_conditional_frame_is_all_or_nothing(conn: Connection) -> None:
    log = conn.log
    await log.append(S1, started(0))
    ok = await log.append_frame(S1, [started(1), finished(1), started(2)], expected_last_seq=1)
    assert ok.seq == 2 and not ok.duplicate
    with pytest.raises(ConcurrencyConflict):
        await log.append_frame(S1, [started(3), finished(3)], expected_last_seq=1)
    assert await log.last_seq() == 2
    records = await read_all(log)
    assert [r.event for r in records] == [started(0), started(1), finished(1), started(2)]
    assert [r.position for r in records] == [(1, 0), (2, 0), (2, 1), (2, 2)]
    with pytest.raises(ValueError, match="at least one event"):
        await log.append_frame(S1, [])


async def test_concurrent_writers_one_wins(conn: Connection) -> None:
    log = conn.log
    await log.append(S1, started(0))
    results = await asyncio.gather(*(log.append(S1, started(10 + i), expected_last_seq=1) for i in range(5)),
                                   return_exceptions=True)
    wins = [r for r in results if isinstance(r, Appended)]
    conflicts = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert len(wins) == 1 and len(conflicts) == 4
    assert await log.last_seq() == 2


# --- reads -------------------------------------------------------------------------------


async def _fill(log: EventLog) -> list[Entry]:
    entries = [Entry([S1, S2, S3][i % 3], started(i) if i % 2 else finished(i), key=f"k{i}") for i in range(12)]
    await log.append_batch(entries)
    return entries


async def test_read_bounds(conn: Connection) -> None:
    log = conn.log
    entries = await _fill(log)
    assert [r.seq for r in await read_all(log, start=3, stop=6)] == [3, 4, 5, 6]
    assert [r.event for r in await read_all(log, start=3, stop=6)] == [e.event for e in entries[2:6]]
    assert [r.seq for r in await read_all(log, start=10)] == [10, 11, 12]
    assert [r.seq for r in await read_all(log, stop=2)] == [1, 2]
    assert [r.seq for r in await read_all(log, start=5, stop=5)] == [5]
    assert [r.seq for r in await read_all(log, stop=1000)] == list(range(1, 13))
    assert await read_all(log, start=13) == []
    assert await read_all(log, start=7, stop=6) == []
    assert await read_all(log, stop=0) == []
    # small fetch batches cross batch boundaries without losing or repeating records
    assert [r.seq for r in await read_all(log, batch=5)] == list(range(1, 13))


async def test_read_stops_at_the_end_it_saw(conn: Connection) -> None:
    log = conn.log
    await _fill(log)
    seen = []
    async for record in log.read():
        seen.append(record.seq)
        if record.seq == 1:
            await log.append(S1, started(500))  # appended after the read began
    assert seen == list(range(1, 13))
    assert await log.last_seq() == 13


async def test_read_subject_filters(conn: Connection) -> None:
    log = conn.log
    entries = await _fill(log)
    one = await read_all(log, subjects=[S2])
    assert [r.seq for r in one] == [2, 5, 8, 11]
    assert all(r.subject == S2 for r in one)
    several = await read_all(log, subjects=[S1, S3])
    assert [r.seq for r in several] == [1, 3, 4, 6, 7, 9, 10, 12]
    assert [r.event for r in several] == [e.event for e in entries if e.subject in (S1, S3)]
    wildcard = await read_all(log, subjects=[trace_filter(run="run-1")])
    assert [r.subject for r in wildcard] == [e.subject for e in entries if e.subject in (S1, S2)]
    task_a = await read_all(log, subjects=[trace_filter(task="task.a")])
    assert {r.subject for r in task_a} == {S1, S3}
    bounded = await read_all(log, subjects=[S1, S2], start=4, stop=8)
    assert [r.seq for r in bounded] == [4, 5, 7, 8]


async def test_read_type_filter(conn: Connection) -> None:
    log = conn.log
    entries = await _fill(log)
    only_started = await read_all(log, types=["env.observation"])
    assert [r.seq for r in only_started] == [2, 4, 6, 8, 10, 12]
    assert all(isinstance(r.event, EnvObservation) for r in only_started)
    both = await read_all(log, types={"env.observation", "processor.triggered"})
    assert [r.event for r in both] == [e.event for e in entries]
    combined = await read_all(log, types=["processor.triggered"], subjects=[S1])
    assert [r.seq for r in combined] == [1, 7]
    assert await read_all(log, types=["hook"]) == []


async def test_reading_nothing_returns_quickly(conn: Connection) -> None:
    log = conn.log
    t0 = time.monotonic()
    assert await read_all(log) == []  # empty stream
    assert await read_all(log, LEDGER.name) == []
    assert await read_all(log, subjects=[S1]) == []
    assert time.monotonic() - t0 < 2.0
    await _fill(log)
    t0 = time.monotonic()
    assert await read_all(log, subjects=[trace_filter(run="nobody")]) == []  # nothing matches
    assert await read_all(log, subjects=[S1], start=11) == []  # matches lie only before start
    assert await read_all(log, subjects=[S3], stop=2) == []  # matches lie only after stop
    assert time.monotonic() - t0 < 2.0


# --- subscribe ---------------------------------------------------------------------------


async def _collect(agen: AsyncIterator[Record], queue: asyncio.Queue[Record]) -> None:
    async for record in agen:
        await queue.put(record)


async def _take(queue: asyncio.Queue[Record], n: int, timeout: float = 5.0) -> list[Record]:
    return [await asyncio.wait_for(queue.get(), timeout) for _ in range(n)]


async def test_subscribe_yields_existing_then_live_records(conn: Connection) -> None:
    log = conn.log
    for i in range(3):
        await log.append(S1, started(i))
    queue: asyncio.Queue[Record] = asyncio.Queue()
    task = asyncio.create_task(_collect(log.subscribe(), queue))
    try:
        existing = await _take(queue, 3)
        assert [r.event for r in existing] == [started(0), started(1), started(2)]
        await log.append(S2, finished(3))
        await log.append_batch([Entry(S1, started(4)), Entry(S1, started(5))], frame_size=2)
        live = await _take(queue, 3)
        assert [r.event for r in live] == [finished(3), started(4), started(5)]
        assert [r.position for r in live] == [(4, 0), (5, 0), (5, 1)]
        assert queue.empty()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_subscribe_with_filters_and_start(conn: Connection) -> None:
    log = conn.log
    await _fill(log)
    queue: asyncio.Queue[Record] = asyncio.Queue()
    task = asyncio.create_task(_collect(log.subscribe(start=5, subjects=[S1], types=["env.observation"]), queue))
    try:
        # S1 holds seqs 1, 4, 7, 10; of those 4 and 10 are attempt.started; start=5 leaves 10
        assert [r.seq for r in await _take(queue, 1)] == [10]
        await log.append(S1, finished(20))  # wrong type
        await log.append(S2, started(21))  # wrong subject
        await log.append(S1, started(22))
        [live] = await _take(queue, 1)
        assert (live.seq, live.event) == (15, started(22))
        assert queue.empty()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_subscribe_on_an_empty_stream_waits_for_the_first_record(conn: Connection) -> None:
    log = conn.log
    queue: asyncio.Queue[Record] = asyncio.Queue()
    task = asyncio.create_task(_collect(log.subscribe(subjects=[trace_filter(run="run-2")]), queue))
    try:
        await log.append(S1, started(0))  # filtered out
        await log.append(S3, started(1))
        [record] = await _take(queue, 1)
        assert record.event == started(1) and record.seq == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# --- quarantine --------------------------------------------------------------------------


async def test_garbage_is_quarantined_and_reading_continues(conn: Connection) -> None:
    log, nc = conn.log, conn.nc
    subject = trace_subject("run-g", 1, "t", 0)
    valid = [started(i) for i in range(5)]
    body = encode_body(RunStarted(run_id="v0"))
    await log.append(subject, valid[0])                                                    # seq 1
    await nc.publish(subject, b"no headers at all")                                        # seq 2
    await log.append(subject, valid[1])                                                    # seq 3
    await nc.publish(subject, body, headers={HX_TYPE: "alien.event", HX_SCHEMA_VERSION: "1"})  # seq 4
    await nc.publish(subject, b"\xc1\xc1 not msgpack",
                     headers={HX_TYPE: "run.started", HX_SCHEMA_VERSION: "1"})             # seq 5
    await log.append(subject, valid[2])                                                    # seq 6
    await nc.publish(subject, body, headers={HX_TYPE: "run.started", HX_SCHEMA_VERSION: "7"})  # seq 7
    raw = msgspec.to_builtins(RunStarted(run_id="v0")) | {"surprise": True}
    await nc.publish(subject, msgspec.msgpack.encode(raw),
                     headers={HX_TYPE: "run.started", HX_SCHEMA_VERSION: "1"})             # seq 8
    await nc.publish(subject, b"\x91\x93",
                     headers={HX_TYPE: FRAME_TYPE, HX_SCHEMA_VERSION: "1"})                # seq 9
    await log.append(subject, valid[3])                                                    # seq 10
    await log.append_frame(subject, [valid[4], HookRecord(stage="emitted", step=1,
                                                          event=StepStart(step=1))])       # seq 11
    await nc.flush()
    await until(lambda: _last_is(log, 11))

    records = await read_all(log)
    assert [r.seq for r in records] == [1, 3, 6, 10, 11, 11]
    assert [r.event for r in records[:5]] == valid
    q = log.quarantine
    assert q.count == 6
    by_seq = {rec.seq: rec for rec in q.records}
    assert sorted(by_seq) == [2, 4, 5, 7, 8, 9]
    assert all(rec.stream == TRACE.name and rec.subject == subject for rec in q.records)
    assert "Hx-Type" in by_seq[2].reason and by_seq[2].type is None and by_seq[2].size == 17
    assert "unknown event type 'alien.event'" in by_seq[4].reason and by_seq[4].type == "alien.event"
    assert "malformed 'run.started' body" in by_seq[5].reason and by_seq[5].type == "run.started"
    assert "schema version '7'" in by_seq[7].reason
    assert "surprise" in by_seq[8].reason
    assert "malformed frame" in by_seq[9].reason and by_seq[9].type == FRAME_TYPE

    # every read that meets them counts them again; a read of some types decodes no other body, so it
    # meets only what it cannot open at all: the message without headers and the malformed frame
    assert [r.event for r in await read_all(log, types=["env.observation"])] == valid
    assert q.count == 8
    assert sorted(rec.seq for rec in list(q.records)[6:]) == [2, 9]
    assert [r.seq for r in await read_all(log, start=4, stop=6)] == [6]
    assert q.count == 10


async def test_subscribe_quarantines_too(conn: Connection) -> None:
    log, nc = conn.log, conn.nc
    queue: asyncio.Queue[Record] = asyncio.Queue()
    task = asyncio.create_task(_collect(log.subscribe(), queue))
    try:
        await nc.publish(S1, b"garbage")
        await log.append(S1, started(0))
        [record] = await _take(queue, 1)
        assert record.seq == 2 and record.event == started(0)
        assert log.quarantine.count == 1
        assert log.quarantine.records[0].seq == 1
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_quarantine_keeps_the_last_records_but_counts_all(conn: Connection) -> None:
    log = EventLog(conn.nc, conn.js)
    log.quarantine.keep = 3
    for i in range(5):
        await conn.nc.publish(S1, f"junk {i}".encode())
    await log.append(S1, started(0))
    await until(lambda: _last_is(log, 6))
    assert [r.seq for r in await read_all(log)] == [6]
    assert log.quarantine.count == 5
    assert [r.seq for r in log.quarantine.records] == [3, 4, 5]


async def _last_is(log: EventLog, seq: int) -> bool:
    return await log.last_seq() >= seq


# --- failures ----------------------------------------------------------------------------


async def test_append_where_no_stream_listens_times_out_as_an_hx_error(conn: Connection) -> None:
    log = EventLog(conn.nc, conn.js, ack_timeout=0.5, retries=1)
    t0 = time.monotonic()
    with pytest.raises(AppendTimeout) as info:
        await log.append("nowhere.x", started(0), key="lost-1")
    assert time.monotonic() - t0 < 5.0
    assert isinstance(info.value, LogError) and isinstance(info.value, HxError)
    assert "nowhere.x" in str(info.value) and "lost-1" in str(info.value)
    assert log.retried == 1

    with pytest.raises(AppendTimeout):
        await log.append_frame("nowhere.y", [started(0)], expected_last_seq=0)

    t0 = time.monotonic()
    with pytest.raises(UnacknowledgedAppends) as batch_info:
        await log.append_batch([Entry("nowhere.x", started(i), key=f"lost-b{i}") for i in range(3)]
                               + [Entry(S1, started(9), key="fine")])
    assert time.monotonic() - t0 < 5.0
    err = batch_info.value
    assert isinstance(err, LogError) and isinstance(err, HxError)
    assert err.keys == ["lost-b0", "lost-b1", "lost-b2"]
    assert "3 append(s) unacknowledged" in str(err)
    # what could be stored was stored, exactly once
    assert [r.event for r in await read_all(log)] == [started(9)]


async def test_events_must_have_a_type(conn: Connection) -> None:
    class Untyped(Event, frozen=True, kw_only=True):
        x: int = 0

    with pytest.raises(HxError, match="no TYPE"):
        await conn.log.append(S1, Untyped())
    assert await conn.log.last_seq() == 0


async def test_an_event_larger_than_the_server_allows_is_a_log_error(conn: Connection) -> None:
    log = conn.log
    huge = RunStarted(run_id="huge", config={"blob": "x" * (conn.nc.max_payload + 1)})
    with pytest.raises(LogError, match="exceed the server's maximum payload"):
        await log.append(S1, huge)
    with pytest.raises(LogError, match="exceed the server's maximum payload"):
        await log.append_frame(S1, [started(0), huge])
    with pytest.raises(LogError, match="exceed the server's maximum payload"):
        await log.append_batch([Entry(S1, started(1)), Entry(S1, huge), Entry(S1, started(2))])
    assert await log.last_seq() == 0  # the batch was refused before anything was sent
    assert (await log.append(S1, started(3))).seq == 1  # and the log still works
