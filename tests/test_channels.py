"""Summary events on their own channels: where they go, that order survives, and that narrow reads skip the bulk."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from hx.runtime.tracer import AttemptTracer, LogWriter
from schemas.envelope import Stamp
from schemas.event import Event
from schemas.hooks import ProcessorTriggered
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundFinished, RoundStarted
from schemas.tools import VerifierScore
from streams.channels import narrowed
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.errors import LogError
from streams.integrity import HEADS_BUCKET
from streams.outgoing import frame_message
from streams.topology import TRACE, trace_filter, trace_subject

RUN = "run-ch"


def attempt_events(task: str, attempt: int, steps: int, *, passed: bool = True) -> list[Event]:
    """What an attempt emits, in order: its start, bulk events, a score, more bulk, its end."""
    def bulk(step: int) -> ProcessorTriggered:
        return ProcessorTriggered(processor="p", group="p", hook="step_end", step=step, action="changed",
                                  reason="x" * 200)
    return [AttemptStarted(run_id=RUN, round=0, task_id=task, attempt=attempt, harness_digest="h", seed=attempt),
            *[bulk(s) for s in range(1, steps + 1)], VerifierScore(verifier="v", passed=passed, score=1.0),
            bulk(steps + 1), AttemptFinished(run_id=RUN, round=0, task_id=task, attempt=attempt, passed=passed,
                                             steps=steps)]


async def write_attempt(conn: Connection, task: str, attempt: int, steps: int, *, per_flush: int = 7) -> list[Event]:
    """Write one attempt through the run loop's tracer, flushing every ``per_flush`` events."""
    tracer = AttemptTracer(LogWriter(conn.log), trace_subject(RUN, 0, task, attempt))
    events = attempt_events(task, attempt, steps)
    for i, event in enumerate(events):
        tracer.emit(event)
        if i % per_flush == per_flush - 1:
            await tracer.drain()
    await tracer.flush()
    await tracer.drain()
    return events


def types_of(events: Sequence[Event]) -> list[str]:
    return [type(e).TYPE for e in events]


async def test_summary_events_go_alone_on_their_channels_and_the_stream_keeps_the_attempts_order(
        nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        events = await write_attempt(conn, "t", 0, steps=20)
        records = [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(RUN, 0)])]
        stored = {r.seq: (await conn.js.get_msg(TRACE.name, seq=r.seq)).subject for r in records}
    assert [r.event for r in records] == events  # all of it, in the order emitted, from one filter
    bulk = trace_subject(RUN, 0, "t", 0)
    assert {r.subject for r in records} == {bulk}  # a record names its attempt, whichever message held it
    where = {r.type: stored[r.seq] for r in records}
    assert where == {"attempt.started": f"{bulk}.started", "verifier.score": f"{bulk}.score",
                     "attempt.finished": f"{bulk}.finished", "processor.triggered": bulk}
    alone = [r for r in records if stored[r.seq] != bulk]
    assert all(sum(1 for o in records if o.seq == r.seq) == 1 for r in alone)  # one event per channel message


async def test_a_narrow_read_receives_only_the_channel_messages(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        for a in range(6):
            await write_attempt(conn, f"t{a}", a, steps=60, per_flush=5)
        messages = await conn.log.last_seq()
        before = conn.nc.stats["in_msgs"]
        finished = [r async for r in conn.log.read(TRACE.name, types=[AttemptFinished.TYPE])]
        received = conn.nc.stats["in_msgs"] - before
        everything = [r async for r in conn.log.read(TRACE.name)]
    assert [(r.event.task_id, r.event.attempt) for r in finished] == [(f"t{a}", a) for a in range(6)]  # type: ignore[attr-defined]
    assert len(everything) == 6 * 64 and messages > 60
    # 6 messages and the consumer's own API replies, where the frames alone are more than 60
    assert received < 20


def test_narrow_filters_are_computed_from_types_and_patterns() -> None:
    pattern = trace_filter(RUN, 2)
    assert narrowed([pattern], [AttemptFinished.TYPE]) == [f"{pattern}.finished"]
    assert narrowed([pattern], [AttemptFinished.TYPE, RoundFinished.TYPE, RoundStarted.TYPE]) == [
        f"{pattern}.finished", f"hx.trace.{RUN}.2._._"]
    assert narrowed([], [AttemptStarted.TYPE]) == ["hx.trace.*.*.*.*.started"]
    assert narrowed([pattern], [AttemptFinished.TYPE, ProcessorTriggered.TYPE]) is None  # in the frames
    assert narrowed([pattern], []) is None


async def test_a_log_written_before_channels_is_still_read_whole(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        # An attempt as hx framed it before channels existed: its summary events inside its frames.
        legacy = attempt_events("old", 0, steps=5)
        subject = trace_subject(RUN, 0, "old", 0)
        out = frame_message(subject, legacy, f"{subject}#0+{len(legacy)}", Stamp.now())
        await conn.nc.jetstream().publish(subject, out.body, headers=out.headers)
        # ... on a server hx had marked: forget the marker, as on a server first opened by this hx now
        await (await conn.js.key_value(HEADS_BUCKET)).delete(f"layout.{TRACE.name}")
    async with connect(NatsSettings(url=nats_url)) as conn:
        await write_attempt(conn, "new", 1, steps=5)
        finished = [r async for r in conn.log.read(TRACE.name, types=[AttemptFinished.TYPE])]
        followed = []
        async with asyncio.timeout(30):  # a guard: a follower that missed the old one would wait for ever
            async for r in conn.log.subscribe(TRACE.name, types=[AttemptFinished.TYPE]):
                followed.append(r)
                if len(followed) == 2:
                    break
    assert [r.event.task_id for r in finished] == ["old", "new"]  # type: ignore[attr-defined]
    assert [r.event.task_id for r in followed] == ["old", "new"]  # type: ignore[attr-defined]


async def test_appends_route_summary_events_and_frames_refuse_them(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        subject = trace_subject(RUN, 0, "t", 0)
        [finished] = attempt_events("t", 0, steps=0)[-1:]
        await conn.log.append(subject, finished, key="k")
        assert await conn.log.last_subject_seq(f"{subject}.finished") == 1
        with pytest.raises(LogError, match=r"attempt\.finished, which go in messages of their own"):
            await conn.log.append_frame(subject, [finished])
        await conn.log.append_frame(trace_subject(RUN, 0), [RoundStarted(run_id=RUN, round=0)])  # not an attempt's
