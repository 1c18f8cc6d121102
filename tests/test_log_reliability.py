"""The log survives a crashed server: acknowledged appends are stored exactly once; garbage is skipped."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from schemas import HX_SCHEMA_VERSION, HX_TYPE, EnvObservation, Record, RunStarted, encode_body
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.errors import UnacknowledgedAppends
from streams.log import Appended, EventLog
from streams.outgoing import Entry
from streams.server import NatsProcess
from streams.topology import TRACE, trace_subject

pytestmark = pytest.mark.slow

N = 20_000
RUN = "crash"


def event(i: int) -> EnvObservation:
    """Event number ``i`` (its ``step``), an attempt-level event on any attempt's subject."""
    return EnvObservation(step=i, observation=f"task-{i % 7}")


def entries(n: int = N) -> list[Entry]:
    return [Entry(trace_subject(RUN, 1, f"task-{i % 7}", i % 3), event(i), key=f"{RUN}#{i}") for i in range(n)]


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


async def stored(conn: Connection) -> int:
    try:
        return int((await conn.js.stream_info(TRACE.name)).state.messages)
    except Exception:  # noqa: BLE001 - the server may be down or recovering right now
        return -1


async def read_everything(log: EventLog) -> list[Record]:
    return [r async for r in log.read()]


def step_of(record: Record) -> int:
    """The ``step`` of a record holding one of these tests' events (an ``EnvObservation``)."""
    assert isinstance(record.event, EnvObservation)
    return record.event.step


async def publish_garbage(conn: Connection, tag: str) -> int:
    """Raw messages no hx reader can decode; returns how many."""
    subject = trace_subject(RUN, 1, "garbage", 0)
    bad = [
        (b"no headers " + tag.encode(), None),
        (encode_body(RunStarted(run_id=tag)), {HX_TYPE: "from.the.future", HX_SCHEMA_VERSION: "1"}),
        (b"\xc1\xc1\xc1" + tag.encode(), {HX_TYPE: "env.observation", HX_SCHEMA_VERSION: "1"}),
        (encode_body(event(0)), {HX_TYPE: "env.observation", HX_SCHEMA_VERSION: "99"}),
    ]
    for body, headers in bad:
        await conn.nc.publish(subject, body, headers=headers)
    await conn.nc.flush()
    return len(bad)


async def test_server_killed_during_a_batch(tmp_path: Path) -> None:
    server = NatsProcess(tmp_path / "nats" / "store")
    server.start(detach=False)
    try:
        async with connect(NatsSettings(url=server.url)) as conn:
            # garbage before the batch
            garbage = await publish_garbage(conn, "before")
            await until(lambda: _at_least(conn, garbage))

            log = EventLog(conn.nc, conn.js, ack_timeout=1.0, retries=10, retry_backoff=0.1)
            batch = entries()
            task = asyncio.create_task(log.append_batch(batch))
            await until(lambda: _at_least(conn, garbage + 2_000))
            assert not task.done(), "the batch finished before the crash; make it larger"

            server.kill()  # SIGKILL: no shutdown, no flush
            server.start(detach=False)  # same store, same port; the client reconnects on its own

            try:
                acks: list[Appended] | None = await asyncio.wait_for(task, 30)
                unacked: list[str] = []
            except UnacknowledgedAppends as exc:
                acks, unacked = None, exc.keys
                assert unacked, "UnacknowledgedAppends must list the keys"

            await until(lambda: _at_least(conn, garbage + 1))  # JetStream is back
            records = await read_everything(log)
            valid = [r for r in records if isinstance(r.event, EnvObservation)]
            counts = Counter(step_of(r) for r in valid)
            twice = sorted(i for i, c in counts.items() if c > 1)
            assert not twice, f"{len(twice)} events stored more than once, e.g. {twice[:5]}"
            for r in valid:
                assert r.event == event(step_of(r))
                assert r.subject == batch[step_of(r)].subject

            unacked_ids = {int(k.rsplit("#", 1)[1]) for k in unacked}
            acked_ids = set(range(N)) - unacked_ids
            missing = sorted(acked_ids - set(counts))
            assert not missing, f"{len(missing)} acknowledged events are not in the stream, e.g. {missing[:5]}"
            if acks is not None:
                # completed: one ack per event, each naming the message that holds that very event
                assert len(acks) == N
                assert [a.key for a in acks] == [e.key for e in batch]
                by_seq = {r.seq: step_of(r) for r in valid}
                assert all(by_seq[a.seq] == i for i, a in enumerate(acks))
                assert len({a.seq for a in acks}) == N
                assert log.retried > 0, "the kill should have forced retries"
            assert log.quarantine.count == garbage

            # the log keeps working after the crash: more garbage and valid events, one full read
            more_garbage = await publish_garbage(conn, "after")
            tail = [Entry(trace_subject(RUN, 2, "after", 0), event(N + i), key=f"{RUN}#{N + i}") for i in range(10)]
            await log.append_batch(tail, frame_size=4)
            await log.append(trace_subject(RUN, 2, "after", 0), event(N + 10), key=f"{RUN}#{N + 10}")
            total = await log.last_seq()
            log.quarantine.count = 0
            records = await read_everything(log)
            assert records[-1].seq == total
            tail_events = [r.event for r in records if r.subject == trace_subject(RUN, 2, "after", 0)]
            assert tail_events == [event(N + i) for i in range(11)]
            assert log.quarantine.count == garbage + more_garbage
            assert {q.reason.split(" ")[0] for q in log.quarantine.records} >= {"missing", "unknown", "malformed"}
    finally:
        server.stop()


async def _at_least(conn: Connection, n: int) -> bool:
    return await stored(conn) >= n


async def test_writer_gives_up_while_the_server_is_down_then_a_retry_completes(tmp_path: Path) -> None:
    server = NatsProcess(tmp_path / "nats" / "store")
    server.start(detach=False)
    try:
        async with connect(NatsSettings(url=server.url)) as conn:
            log = EventLog(conn.nc, conn.js, ack_timeout=0.5, retries=2, retry_backoff=0.05)
            batch = entries()
            task = asyncio.create_task(log.append_batch(batch))
            await until(lambda: _at_least(conn, 2_000))
            assert not task.done(), "the batch finished before the crash; make it larger"
            server.kill()  # and it stays down until the writer has given up

            with pytest.raises(UnacknowledgedAppends) as info:
                await asyncio.wait_for(task, 30)
            unacked = info.value.keys
            assert unacked and len(unacked) == len(set(unacked)) < N
            assert set(unacked) <= {e.key for e in batch}
            assert f"{len(unacked)} append(s) unacknowledged" in str(info.value)

            server.start(detach=False)  # same store, same port
            await until(lambda: _at_least(conn, 1))
            records = await read_everything(log)
            counts = Counter(step_of(r) for r in records)
            assert all(c == 1 for c in counts.values()), "an event was stored twice"
            acked = set(range(N)) - {int(k.rsplit("#", 1)[1]) for k in unacked}
            missing = sorted(acked - set(counts))
            assert not missing, f"{len(missing)} acknowledged events are not in the stream, e.g. {missing[:5]}"

            # the writer's remedy: append the same batch again; keys make it exactly-once
            acks = await asyncio.wait_for(log.append_batch(batch), 30)
            assert len(acks) == N and [a.key for a in acks] == [e.key for e in batch]
            records = await read_everything(log)
            # once each; not necessarily in batch order (a gap lost in the kill is filled in later)
            assert sorted(step_of(r) for r in records) == list(range(N))
            by_seq = {r.seq: step_of(r) for r in records}
            assert all(by_seq[a.seq] == i for i, a in enumerate(acks))
            assert log.quarantine.count == 0
    finally:
        server.stop()


async def test_garbage_between_valid_events_in_a_long_log(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        log = conn.log
        expected: list[EnvObservation] = []
        junk = 0
        for chunk in range(5):
            part = [Entry(trace_subject(RUN, 1, "t", chunk), event(chunk * 1000 + i), key=f"g{chunk}-{i}")
                    for i in range(1000)]
            await log.append_batch(part, frame_size=1 if chunk % 2 else 50)
            expected.extend(e.event for e in part)  # type: ignore[misc]
            junk += await publish_garbage(conn, f"chunk-{chunk}")
        await until(lambda: _at_least(conn, 2 * 1000 + 3 * 20 + junk), timeout=10)

        records = await read_everything(log)
        assert [r.event for r in records] == expected
        positions = [r.position for r in records]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert log.quarantine.count == junk == 20
        assert all(q.subject == trace_subject(RUN, 1, "garbage", 0) for q in log.quarantine.records)
