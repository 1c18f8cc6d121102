"""When things happened: every event's own time on the log, and how long each model and tool call took.

A run against a model server that answers ``LATENCY_S`` late: each model response's
``took_ns`` covers that latency, its start is its request's time, events of an attempt are in
time order however they were framed, a frame keeps its own (later) send time, and a replay of
the round, which happens at other times, is still identical to the log.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hx_cli import hx, ok
from model_server import model_server

from hx.aegis.ledger import signed
from schemas.envelope import (
    OpenedMessage,
    Record,
    Stamp,
    decode_message,
    encode_frame,
    encode_frame_bodies,
    encoded,
    frame_headers,
    headers_for,
)
from schemas.ledger import RoundDecided, ledger_digest
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.model import ModelRequest, ModelResponse
from schemas.tools import ToolInvoked, ToolReturned
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.signing import LedgerKey, verify
from streams.topology import TRACE, trace_filter

LATENCY_S = 0.08
TimedRun = tuple[str, Path, list[Record]]
"""The run's nats URL, its data dir and its trace."""
RUN = "timed"


async def _records(nats_url: str, run: str) -> list[Record]:
    async with connect(NatsSettings(url=nats_url)) as conn:
        return [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(run)])]


@pytest.fixture(scope="module")
def timed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TimedRun]:
    """One small run against the slow model server, on a module-wide nats-server."""
    tmp = tmp_path_factory.mktemp("timed")
    proc = NatsProcess(tmp / "nats" / "store")
    proc.start(detach=False)
    try:
        with model_server("play", latency_s=LATENCY_S) as server:
            ok(hx("--nats-url", proc.url, "--data-dir", str(tmp), "run", "--tasks", "2", "--attempts", "1",
                  "--max-steps", "3", "--model", f"openai:m@http://{server.url}/v1", "--run-id", RUN))
        yield proc.url, tmp, asyncio.run(_records(proc.url, RUN))
    finally:
        proc.stop()


def _attempts(records: list[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.subject.count(".") == 5 and not r.subject.endswith("._"):
            out[r.subject].append(r)
    return out


def test_each_model_call_took_the_servers_latency_and_started_at_its_request(timed_run: TimedRun) -> None:
    _, _, records = timed_run
    responses = 0
    for subject, attempt in _attempts(records).items():
        request: Record | None = None
        for r in attempt:
            if isinstance(r.event, ModelRequest):
                request = r
            elif isinstance(r.event, ModelResponse):
                assert request is not None, subject
                assert r.took_ns >= LATENCY_S * 1e9, (subject, r.took_ns)
                # measured on the monotonic clock, kept to the microsecond
                assert abs(r.took_ns - (r.mono_ns - request.mono_ns)) <= 2_000
                # wall and monotonic clocks are read one after the other: the start agrees to well under a ms
                assert abs(r.start_ns - request.time_ns) < 1_000_000
                responses += 1
    assert responses >= 2


def test_tool_calls_have_their_duration_and_other_events_none(timed_run: TimedRun) -> None:
    _, _, records = timed_run
    returned = [r for r in records if isinstance(r.event, ToolReturned)]
    assert returned and all(r.took_ns > 0 for r in returned)
    invoked = {r.time_ns for r in records if isinstance(r.event, ToolInvoked)}
    assert all(min(abs(r.start_ns - t) for t in invoked) < 1_000_000 for r in returned)
    assert all(r.took_ns == 0 for r in records if not type(r.event).ENDS)


def test_an_attempts_events_are_in_time_order_and_reached_the_log_after_they_happened(timed_run: TimedRun) -> None:
    _, _, records = timed_run
    for subject, attempt in _attempts(records).items():
        monos = [r.mono_ns for r in attempt]
        assert monos == sorted(monos), subject
        assert all(0 < r.time_ns <= r.frame_ns for r in attempt), subject
        # several events share a frame, yet each has its own time (to the microsecond)
        assert len({r.time_ns for r in attempt}) > 2 * len({r.seq for r in attempt}), subject
        started, finished = attempt[0], attempt[-1]
        assert isinstance(started.event, AttemptStarted) and isinstance(finished.event, AttemptFinished)
        steps = finished.event.steps
        assert finished.time_ns - started.time_ns >= steps * LATENCY_S * 1e9


def test_a_replay_happens_at_its_own_times_and_is_identical(timed_run: TimedRun) -> None:
    url, tmp, _ = timed_run
    result = ok(hx("--nats-url", url, "--data-dir", str(tmp), "replay", RUN, "--round", "0"))
    assert "identical: 2 attempts" in result.output, result.output
    logged = result.stderr.split("(logged: ")[1]
    attempts_s, model_s = (float(part.split("s")[0]) for part in logged.split(", ")[:2])
    assert model_s >= 4 * LATENCY_S and attempts_s >= model_s, result.stderr


def test_hx_trace_and_log_dump_show_the_times(timed_run: TimedRun) -> None:
    url, tmp, records = timed_run
    task = next(r.event.task_id for r in records if isinstance(r.event, AttemptStarted))
    shown = ok(hx("--nats-url", url, "--data-dir", str(tmp), "trace", RUN, task)).output
    model_lines = [line for line in shown.splitlines() if line.strip().startswith("model ")]
    assert model_lines and all(line.rstrip().endswith(" ms]") for line in model_lines), shown
    assert "step 1  (at " in shown
    dumped = ok(hx("--nats-url", url, "--data-dir", str(tmp), "log", "dump", "--stream", TRACE.name)).output
    lines = [msgspec.json.decode(line) for line in dumped.splitlines()]
    took = [line["took_ms"] for line in lines if line["type"] == ModelResponse.TYPE]
    assert took and min(took) >= LATENCY_S * 1e3
    assert all("took_ms" not in line for line in lines if line["type"] == AttemptStarted.TYPE)


def test_frames_carry_each_events_stamp_and_old_frames_take_the_frames_time() -> None:
    a, b = AttemptStarted(run_id="r", round=0, task_id="t", attempt=0), ModelRequest(role="main", model="m", step=1)
    sent = Stamp(1_795_000_000_000_000_000, 90_000_000_000)
    headers = frame_headers("id", sent, 2)
    first_at = Stamp(sent.wall_ns - 7_000_000, sent.mono_ns - 7_000_000)
    second_at = Stamp(sent.wall_ns - 2_000_000, sent.mono_ns - 2_000_000, 300_000)
    body = encode_frame_bodies([encoded(a, first_at), encoded(b, second_at)], sent)
    for first, second in (decode_message("hx.trace.r.0.t.0", 3, headers, body),
                          [OpenedMessage("hx.trace.r.0.t.0", 3, headers, body).record(i) for i in (0, 1)]):
        assert (first.time_ns, first.mono_ns, first.took_ns) == (first_at.wall_ns, first_at.mono_ns, 0)
        assert first.frame_ns == second.frame_ns == sent.wall_ns
        assert (second.time_ns, second.mono_ns) == (second_at.wall_ns, second_at.mono_ns)
        assert second.took_ns == second_at.took_ns
        assert second.start_ns == second_at.wall_ns - 300_000
    # kept to the microsecond, relative to the frame: a few bytes an event, not three 9-byte integers
    assert len(body) - len(encode_frame([a, b])) <= 2 * 8
    old = decode_message("hx.trace.r.0.t.0", 3, headers_for("hx.frame", 1, "id", 5_000, count=2),
                         encode_frame([a, b]))  # written before stamps
    assert [(r.time_ns, r.mono_ns, r.took_ns) for r in old] == [(5_000, 0, 0)] * 2


def test_a_ledger_events_time_is_covered_by_its_signature() -> None:
    key = LedgerKey.generate()
    event = signed(RoundDecided(run_id="r", round=1, outcome="no_candidate", at_ns=1_795_000_000_000_000_000), key)
    assert verify(key.public_key, ledger_digest(event), event.signature) == ""
    moved = msgspec.structs.replace(event, at_ns=event.at_ns - 3_600_000_000_000)
    assert verify(key.public_key, ledger_digest(moved), moved.signature) != ""
