"""The otel projection on real runs: GenAI spans in the SDK's in-memory exporter and at a real OTLP/HTTP receiver."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hx_cli import error_line, hx, ok
from model_server import RecordedReplies, model_server, serving
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from subscribe_kit import checkpoint, interleaved_attempts, output_of, records, stop, toy_run

from projections.base import Projection
from projections.otel_spans import OtelSpans, SpanExportRunner
from projections.testing import ProjectionKit
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.model import ModelRequest, ModelResponse
from schemas.tools import ToolInvoked
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import TraceAddress, trace_filter

PASSWORD = "S3cret-otel-Passw0rd-in-the-url"
API_KEY = "sk-test-otel-key-that-must-not-leak-42"


def export(nats_url: str) -> list[ReadableSpan]:
    """Every finished attempt on the log as spans, through the SDK's in-memory exporter."""
    async def build() -> list[ReadableSpan]:
        exporter = InMemorySpanExporter()
        async with connect(NatsSettings(url=nats_url)) as conn:
            runner = SpanExportRunner(conn.log, OtelSpans(), exporter)
            await runner.catch_up(checkpoint=False)
            runner.flush()
        return list(exporter.get_finished_spans())
    return asyncio.run(build())


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def ids(span: ReadableSpan) -> tuple[int, int]:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


class TestOtelKit(ProjectionKit):
    """The fold is pure: polled, followed, resumed, rebuilt and as-of states agree (open spans included)."""

    def make_projection(self) -> Projection[Any]:
        return OtelSpans()

    def append_events(self, log: EventLog) -> AsyncIterator[object]:
        return interleaved_attempts(log)


async def test_interleaved_attempts_give_one_trace_each(nats_url: str) -> None:
    """Attempts written interleaved: each trace whole, its chat and tool spans under its own root."""
    exporter = InMemorySpanExporter()
    async with connect(NatsSettings(url=nats_url)) as conn:
        async for _ in interleaved_attempts(conn.log):
            pass
        runner = SpanExportRunner(conn.log, OtelSpans(), exporter, batch_spans=1)
        await runner.catch_up(checkpoint=False)
    spans = exporter.get_finished_spans()
    assert runner.exported_traces == 3 and len(spans) == 9 and not runner.state.open
    for root in (s for s in spans if s.parent is None):
        children = [s for s in spans if s.parent is not None and s.parent.span_id == ids(root)[1]]
        assert sorted(s.name for s in children) == ["chat m", "execute_tool act"]
        assert {ids(s)[0] for s in children} == {ids(root)[0]}
        attempt = attrs(root)["hx.attempt"]
        tool = next(s for s in children if s.name == "execute_tool act")
        assert attrs(tool)["gen_ai.tool.call.id"] == f"c{attempt}"
        assert (tool.status.status_code == StatusCode.ERROR) == (attempt % 2 == 1)
        chat = attrs(next(s for s in children if s.name == "chat m"))
        assert (chat["gen_ai.response.model"], chat["gen_ai.request.temperature"]) == ("m-1", 0.5)
        assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (7, 3)


@pytest.mark.slow
def test_a_real_runs_spans_follow_the_genai_conventions(nats_url: str, tmp_path: Path) -> None:
    with model_server("play") as server:
        toy_run(nats_url, tmp_path, "otel-run", "--model", f"openai:m@http://hxuser:{PASSWORD}@{server.url}/v1",
                max_steps=3, env={"HX_OPENAI_API_KEY": API_KEY})
    spans = export(nats_url)
    log = records(nats_url, [trace_filter("otel-run")])
    started = {r.subject: r for r in log if isinstance(r.event, AttemptStarted)}
    finished = {r.subject: r for r in log if isinstance(r.event, AttemptFinished)}
    assert len(started) == len(finished) == 4

    roots = [s for s in spans if s.parent is None]
    assert sorted(s.name for s in roots) == ["invoke_agent hx"] * 4
    assert len({ids(s)[0] for s in spans}) == 4  # one trace per attempt
    names = Counter(s.name for s in spans)
    calls = [r for r in log if isinstance(r.event, ToolInvoked)]
    requests = [r for r in log if isinstance(r.event, ModelRequest)]
    assert names == {"invoke_agent hx": 4, "chat m": len(requests), "execute_tool act": len(calls)}
    for root in roots:
        a = attrs(root)
        subject = TraceAddress(a["hx.run.id"], a["hx.round"], a["hx.task.id"], a["hx.attempt"]).subject
        assert root.start_time == started[subject].time_ns and root.end_time == finished[subject].time_ns
        done = finished[subject].event
        assert isinstance(done, AttemptFinished)
        assert (a["gen_ai.operation.name"], a["gen_ai.agent.name"], a["gen_ai.provider.name"],
                a["gen_ai.request.model"]) == ("invoke_agent", "hx", "openai", "m")
        assert (a["hx.passed"], a["hx.steps"], a["hx.status"]) == (done.passed, done.steps, done.status)
        children = [s for s in spans if s.parent is not None and s.parent.span_id == ids(root)[1]]
        assert {ids(s)[0] for s in children} == {ids(root)[0]}
        assert len(children) == len([r for r in log if r.subject == subject
                                     and isinstance(r.event, ToolInvoked | ModelRequest)])
    assert all(s.parent is None or s.parent.span_id in {ids(r)[1] for r in roots} for s in spans)

    chat = next(s for s in spans if s.name == "chat m")
    a = attrs(chat)
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"],
            a["gen_ai.response.model"]) == ("chat", "openai", "m", "stand-in")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (10, 5)  # the server's usage
    assert a["gen_ai.response.finish_reasons"] == ("tool_calls",) and a["hx.step"] == 1
    responses = [r for r in log if isinstance(r.event, ModelResponse)]
    assert {(s.start_time, s.end_time) for s in spans if s.name == "chat m"} == {
        (r.start_ns, r.time_ns) for r in responses}  # each call's own measured time
    tool = next(s for s in spans if s.name == "execute_tool act")
    a = attrs(tool)
    assert (a["gen_ai.operation.name"], a["gen_ai.tool.name"], a["gen_ai.tool.type"]) == (
        "execute_tool", "act", "function")
    assert a["gen_ai.tool.call.id"] in {r.event.call.id for r in calls if isinstance(r.event, ToolInvoked)}
    assert all(s.status.status_code != StatusCode.ERROR for s in spans if s.name != "invoke_agent hx")

    text = repr([(s.name, attrs(s), s.status.description, s.resource.attributes) for s in spans])
    assert PASSWORD not in text and API_KEY not in text and "hxuser" not in text and server.url not in text
    again = export(nats_url)  # the same log, the same trace and span ids
    assert sorted(ids(s) for s in again) == sorted(ids(s) for s in spans)


class Receiver:
    """What the OTLP/HTTP receiver got: every span, decoded from the protobuf request body."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        self.projects: list[str] = []
        """Each span's resource attribute openinference.project.name."""
        self.arrived = threading.Condition()
        """Notified after each request's spans are stored."""

    def wait_for_roots(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` root spans (attempt traces) have arrived."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len([s for s in self.spans if not s.parent_span_id]) >= n, timeout)


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    """A real OTLP/HTTP trace receiver on loopback: POST /v1/traces with an ExportTraceServiceRequest."""
    got = Receiver()

    class Handler(RecordedReplies):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            got.paths.append(self.path)
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                self.reply(404, b"")
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with got.arrived:
                for resource_spans in request.resource_spans:
                    project = values(resource_spans.resource).get("openinference.project.name", "")
                    for scope_spans in resource_spans.scope_spans:
                        got.spans.extend(scope_spans.spans)
                        got.projects.extend([project] * len(scope_spans.spans))
                got.arrived.notify_all()
            self.reply(200, ExportTraceServiceResponse().SerializeToString(),
                       {"content-type": "application/x-protobuf"})

    with serving(Handler) as url:
        yield url, got


def values(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_spans_reach_a_real_otlp_receiver_once(nats_url: str, tmp_path: Path) -> None:
    toy_run(nats_url, tmp_path, "to-otlp", tasks=1, attempts=2, max_steps=4)
    with otlp_receiver() as (url, got):
        out = ok(hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", url)).stdout
        assert "of 2 attempt traces" in out and set(got.paths) == {"/v1/traces"}
        names = Counter(s.name for s in got.spans)
        assert names["invoke_agent hx"] == 2 and names["chat random"] == names["execute_tool act"] > 0
        assert len({s.trace_id for s in got.spans}) == 2
        roots = [s for s in got.spans if not s.parent_span_id]
        assert {values(s)["hx.attempt"] for s in roots} == {0, 1}
        assert {values(s)["hx.run.id"] for s in roots} == {"to-otlp"}
        tool = next(s for s in got.spans if s.name == "execute_tool act")
        assert values(tool)["gen_ai.tool.name"] == "act" and tool.parent_span_id in {s.span_id for s in roots}
        assert {values(s)["session.id"] for s in got.spans} == {"to-otlp"} and set(got.projects) == {"toy"}
        assert all(s.end_time_unix_nano > s.start_time_unix_nano for s in got.spans)  # true durations
        sent = len(got.spans)

        again = ok(hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", url)).stdout
        assert "resumed from" in again and len(got.spans) == sent  # a resumed export sends nothing twice
        toy_run(nats_url, tmp_path, "to-otlp-2", tasks=1, attempts=1, max_steps=4)
        ok(hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", url + "/v1/traces",
              "--project", "mine"))
        new = got.spans[sent:]
        assert {values(s)["hx.run.id"] for s in new if not s.parent_span_id} == {"to-otlp-2"}
        assert set(got.projects[sent:]) == {"mine"}


def test_an_endpoint_answering_an_http_error_is_one_line(nats_url: str, tmp_path: Path) -> None:
    """A receiver that answers 500 or 404: one error line naming the endpoint, and no checkpoint."""
    toy_run(nats_url, tmp_path, "refused", tasks=1, attempts=1, max_steps=2)
    for code in (500, 404):
        class Refusing(RecordedReplies):
            status = code

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.reply(self.status, b"no")

        with serving(Refusing) as url:
            result = hx("--nats-url", nats_url, "projections", "run", "otel", "--once",
                        "--otlp-endpoint", f"{url}?api_key={API_KEY}", "--otlp-timeout", "0.5")
        line = error_line(result)
        assert result.stderr.strip().splitlines() == [line] and url in line and API_KEY not in result.output
        assert "exporting" in line and "failed" in line
        assert checkpoint(nats_url, OtelSpans()) is None


def test_an_unreachable_endpoint_is_one_line_and_checkpoints_nothing(nats_url: str, tmp_path: Path) -> None:
    toy_run(nats_url, tmp_path, "nowhere", tasks=1, attempts=1, max_steps=2)
    url = f"http://otel:{PASSWORD}@127.0.0.1:{free_port()}"
    result = hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", url,
                "--otlp-timeout", "0.5")
    line = error_line(result)
    # One line: the exporter's own retry and failure log lines are ours to report, and no summary of a failed export.
    assert result.stderr.strip().splitlines() == [line] and "exported" not in result.stdout
    assert "exporting" in line and "failed" in line and PASSWORD not in result.output
    assert checkpoint(nats_url, OtelSpans()) is None  # nothing claimed as exported
    assert "not an http(s) URL" in error_line(
        hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", "127.0.0.1:4318"))
    assert "give --otlp-endpoint" in error_line(hx("--nats-url", nats_url, "projections", "run", "otel", "--once"))
    assert "--from-start --once --otlp-endpoint" in error_line(
        hx("--nats-url", nats_url, "projections", "rebuild", "otel"))
    assert checkpoint(nats_url, OtelSpans()) is None


@pytest.mark.slow
def test_a_follower_exports_each_attempt_as_it_finishes(nats_url: str, tmp_path: Path) -> None:
    with otlp_receiver() as (url, got):
        follower = subprocess.Popen(
            [sys.executable, "-m", "hx", "--nats-url", nats_url, "projections", "run", "otel", "--otlp-endpoint", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert follower.stderr is not None and follower.stdout is not None
            assert "following the log" in follower.stderr.readline()
            toy_run(nats_url, tmp_path, "followed", tasks=1, attempts=3, max_steps=3)
            assert got.wait_for_roots(3, timeout=60), output_of(follower)  # exported live, before any stop
            stop(follower)
            assert "exported" in follower.stderr.read()
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    roots = [s for s in got.spans if not s.parent_span_id]
    assert sorted(values(s)["hx.attempt"] for s in roots) == [0, 1, 2]
    cp = checkpoint(nats_url, OtelSpans())
    last_finish = max(r.seq for r in records(nats_url, types=[AttemptFinished.TYPE]))
    assert cp is not None and cp.seq >= last_finish  # checkpointed on the way out, past every exported span


def test_an_attempt_still_running_is_exported_when_it_finishes(nats_url: str, tmp_path: Path) -> None:
    toy_run(nats_url, tmp_path, "in-flight", tasks=1, attempts=1, max_steps=3)
    subject = "hx.trace.in-flight.0.toy:walk:dev:0.9"

    async def append(event: AttemptStarted | AttemptFinished) -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            await conn.log.append(subject, event)

    asyncio.run(append(AttemptStarted(run_id="in-flight", round=0, task_id="toy:walk:dev:0", attempt=9)))
    with otlp_receiver() as (url, got):
        out = ok(hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", url)).stdout
        assert "1 attempts still running: exported when they finish" in out
        roots = [s for s in got.spans if not s.parent_span_id]
        assert {values(s)["hx.attempt"] for s in roots} == {0}  # the finished one only
        asyncio.run(append(AttemptFinished(run_id="in-flight", round=0, task_id="toy:walk:dev:0", attempt=9,
                                           passed=True, score=1.0, steps=0, status="completed")))
        out = ok(hx("--nats-url", nats_url, "projections", "run", "otel", "--once", "--otlp-endpoint", url)).stdout
        assert "still running" not in out
        roots = [s for s in got.spans if not s.parent_span_id]
        assert [values(s)["hx.attempt"] for s in roots] == [0, 9]  # once each
        assert values(roots[1])["session.id"] == "in-flight"
