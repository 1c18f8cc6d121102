"""Subjects against bodies: an event on a malformed or disagreeing subject is quarantined, not folded."""

from __future__ import annotations

from nats.aio.client import Client as NATS

from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory, TaskRound
from schemas.envelope import Stamp, encode_body, headers_for
from schemas.event import Event
from schemas.lifecycle import AttemptFinished, RoundStarted, RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.outgoing import frame_message
from streams.topology import TRACE, trace_subject


def verdict(run: str = "r", round: int = 0, task: str = "t", attempt: int = 0) -> AttemptFinished:
    return AttemptFinished(run_id=run, round=round, task_id=task, attempt=attempt, passed=True, score=1.0)


async def publish(nc: NATS, subject: str, event: Event, key: str) -> None:
    """A message as any publisher could send it: valid envelope and body, wherever the subject says."""
    cls = type(event)
    await nc.jetstream().publish(subject, encode_body(event), headers=headers_for(cls.TYPE, cls.VERSION, key, 1))


async def task_history(log: EventLog) -> dict[str, TaskRound]:
    runner: ProjectionRunner[dict[str, TaskRound]] = ProjectionRunner(log, TaskHistory())
    async for record in log.read(TRACE.name):
        runner.apply(record)
    return runner.state


async def test_only_events_where_their_body_says_are_folded(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        good = trace_subject("r", 0, "t", 0)
        await publish(conn.nc, good, verdict(), "ok")                                        # seq 1: folded
        await publish(conn.nc, "hx.trace.x", verdict(attempt=1), "short")                    # seq 2: not an address
        await publish(conn.nc, "hx.trace.r.0.t.1.s.x", verdict(attempt=1), "long")           # seq 3: eight tokens
        await publish(conn.nc, trace_subject("r", 0, "t", 2), verdict(run="other", attempt=2), "run")      # seq 4
        await publish(conn.nc, trace_subject("r", 0, "t", 3), verdict(task="u", attempt=3), "task")        # seq 5
        await publish(conn.nc, trace_subject("r", 0, "t", 4), verdict(attempt=5), "attempt")               # seq 6
        await publish(conn.nc, trace_subject("r", 1, "t", 6), verdict(attempt=6), "round")                 # seq 7
        await publish(conn.nc, trace_subject("r", 0), verdict(attempt=7), "level")                         # seq 8
        await publish(conn.nc, trace_subject("r", 0, "t", 8), RunStarted(run_id="r"), "run-level")         # seq 9
        await publish(conn.nc, trace_subject("r", 0), RoundStarted(run_id="r", round=0), "round-ok")       # seq 10
        await publish(conn.nc, trace_subject("r", 0, "t", 10, "started"), verdict(attempt=10), "channel")  # seq 11
        await publish(conn.nc, trace_subject("r", 0, "t", 11, "finished"), verdict(attempt=11), "ch-ok")   # seq 12
        state = await task_history(conn.log)
        quarantined = {q.seq: q.reason for q in conn.log.quarantine.records}
    assert list(state) == ["r/0/t"] and state["r/0/t"].attempts == {"0": True, "11": True}
    assert sorted(quarantined) == [2, 3, 4, 5, 6, 7, 8, 9, 11]
    assert "not a trace subject: 'hx.trace.x'" in quarantined[2]
    assert "not a trace subject" in quarantined[3]
    assert quarantined[4] == "attempt.finished says run_id 'other', its subject says run 'r'"
    assert quarantined[5] == "attempt.finished says task_id 'u', its subject says task 't'"
    assert quarantined[6] == "attempt.finished says attempt 5, its subject says attempt 4"
    assert quarantined[7] == "attempt.finished says round 0, its subject says round 1"
    assert quarantined[8] == "attempt.finished belongs on an attempt's subject, not on 'hx.trace.r.0._._'"
    assert quarantined[9] == "run.started belongs on a run's subject, not on 'hx.trace.r.0.t.8'"
    assert quarantined[11] == "attempt.finished does not belong on channel 'started' ('hx.trace.r.0.t.10.started')"


async def test_an_event_that_disagrees_inside_a_frame_is_dropped_alone(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        subject = trace_subject("r", 0, "t", 0)
        # As hx wrote frames before summary events had channels (it refuses to now: see test_channels).
        out = frame_message(subject, [verdict(), verdict(attempt=9), verdict()], "legacy", Stamp.now())
        await conn.nc.jetstream().publish(subject, out.body, headers=out.headers)
        records = [r async for r in conn.log.read()]
        [q] = conn.log.quarantine.records
    assert [r.index for r in records] == [0, 2]
    assert (q.seq, q.index, q.type) == (1, 1, AttemptFinished.TYPE)
