"""The ``otel`` projection: every attempt on the log as an OpenTelemetry trace (GenAI semantic conventions).

The fold feeds an attempt's lifecycle, model and tool events to the span builder of
``projections.attempt_spans`` (shared with the live ``otel_spans`` processor, so both make
the same spans), one trace per attempt: ``invoke_agent hx`` with a ``chat {model}`` child per
model call and an ``execute_tool {tool}`` child per tool call. Span times are the events' own
times (``Record.time_ns``; a call's end carries its measured duration, ``took_ns``); events of
old logs, stamped only with their frame's time, keep their order and never end before they
start. Trace and span ids derive from the attempt's address and the calls' numbers, so the
same log always yields the same ids: a trace exported twice (after a crash between export and
checkpoint) is the same trace. Each run's spans carry the resource attribute
``openinference.project.name`` (Phoenix's project): the run's benchmark (from its
``run.started``), else ``hx``, unless the runner is given one project for all.

The fold stays pure: the state holds the spans of the attempts still open, and
``completed``, the spans the last ``attempt.finished`` closed. ``SpanExportRunner`` hands
those to an OpenTelemetry ``SpanExporter`` (OTLP, in-memory, console) and flushes the
exporter before every checkpoint, so a checkpoint never covers a span that was not
exported (delivery is at least once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar
from urllib.parse import urlsplit

import msgspec
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from projections.attempt_spans import (
    AttemptSpans,
    SpanData,
    end_chat,
    end_tool,
    fail_chat,
    finish_attempt,
    open_attempt,
    start_chat,
    start_tool,
)
from projections.base import Projection
from projections.errors import ExportFailed
from projections.runner import Checkpoint, ProjectionRunner
from projections.trace_store import attempt_key
from schemas.envelope import Record
from schemas.errors import HistoryGap
from schemas.history import apply, conversation, packed
from schemas.hooks import HookRecord
from schemas.lifecycle import AttemptFinished, AttemptStarted, RunStarted
from schemas.messages import Message
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import ToolInvoked, ToolReturned
from streams.log import EventLog
from streams.redaction import register_url, scrub
from streams.topology import TraceAddress

SCOPE = "hx.projections.otel"
TRACES_PATH = "/v1/traces"
EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
"""The parent of the OTLP exporters' loggers (``...proto.http.trace_exporter``, ``...common``)."""
PROJECT = "openinference.project.name"
"""The resource attribute Phoenix takes a span's project from."""
DEFAULT_PROJECT = "hx"
"""The project of a run whose benchmark is not known."""


class OtelState(msgspec.Struct, kw_only=True):
    """Open attempts by key (``run/round/task/attempt``), the last completed trace, and each run's project."""

    open: dict[str, AttemptSpans] = {}
    completed: list[SpanData] = []
    """The spans the last ``attempt.finished`` completed (its whole trace, root last)."""
    traces: int = 0
    projects: dict[str, str] = {}
    """A run's default project by run id: its benchmark(s), from its ``run.started``."""


def run_project(event: RunStarted) -> str:
    """The project a run's spans go to by default: its benchmark (``twx``), several joined by ``+``, else ``hx``."""
    config = event.config
    benches = config.get("benchmarks") or config.get("benches") or ()
    names = sorted({str(b).partition(":")[0] for b in benches if str(b)}) if isinstance(benches, list) else []
    return "+".join(names) or DEFAULT_PROJECT


def _conversation(spans: AttemptSpans, event: ModelRequest | HookRecord) -> tuple[Message, ...] | None:
    """The conversation an event carries, resolved against the attempt's previous one (``schemas.history``).

    None when it cannot be: its base conversation was not folded (the fold began mid-attempt).
    """
    history = packed(event)
    if history is None:
        messages = conversation(event)
    elif history.ordinal == 0 or spans.ordinal == history.ordinal - 1:
        try:
            messages = apply(spans.conversation if history.ordinal else (), history.parts)
        except HistoryGap:
            return None
        spans.ordinal = history.ordinal
    else:
        return None
    if messages is not None:
        spans.conversation = messages
    return messages


class OtelSpans(Projection[OtelState]):
    """GenAI spans of every attempt: ``invoke_agent`` with ``chat`` and ``execute_tool`` children.

    ``content``: the spans carry message content and tool input and output, scrubbed (the fold
    then also reads the hook records, to resolve the logged conversation deltas).
    """

    name: ClassVar[str] = "otel"
    version: ClassVar[int] = 2
    """Version 1 had no ``session.id``, project or verdict status, and ids by log position."""
    reads = frozenset({RunStarted.TYPE, AttemptStarted.TYPE, AttemptFinished.TYPE, ModelRequest.TYPE,
                       ModelResponse.TYPE, ModelError.TYPE, ToolInvoked.TYPE, ToolReturned.TYPE, HookRecord.TYPE})
    state_type = OtelState

    def __init__(self, *, content: bool = False) -> None:
        self.content = content

    def initial(self) -> OtelState:
        """No attempt open, none completed."""
        return OtelState()

    def fold(self, state: OtelState, record: Record) -> OtelState:
        """Open, annotate or close the span the record marks."""
        if state.completed:
            state.completed = []
        event = record.event
        if isinstance(event, RunStarted):
            state.projects[event.run_id] = run_project(event)
            return state
        try:
            addr = TraceAddress.parse(record.subject)
        except ValueError:
            return state
        if addr.round is None or addr.task is None or addr.attempt is None:
            return state
        key = attempt_key(addr.run, addr.round, addr.task, addr.attempt)
        at = record.time_ns
        if isinstance(event, AttemptStarted):
            state.open[key] = open_attempt(addr.run, addr.round, addr.task, addr.attempt, at, model=event.model,
                                           harness_digest=event.harness_digest, content=self.content)
            return state
        spans = state.open.get(key)
        if spans is None:
            return state  # the attempt began before this projection's first event (--from): no root to hang it on
        if isinstance(event, HookRecord):
            if spans.content:
                _conversation(spans, event)  # only to keep the attempt's conversations resolvable
        elif isinstance(event, ModelRequest):
            messages = _conversation(spans, event) if spans.content else None
            start_chat(spans, at, step=event.step, spec=event.model, role=event.role, try_index=event.try_index,
                       params=dict(event.params), messages=messages)
        elif isinstance(event, ModelResponse):
            end_chat(spans, at, spec=event.model, model_version=event.model_version, stop_reason=event.stop_reason,
                     content=event.content, tool_calls=event.tool_calls, input_tokens=event.usage.input_tokens,
                     output_tokens=event.usage.output_tokens, took_ns=record.took_ns)
        elif isinstance(event, ModelError):
            fail_chat(spans, at, event.kind, took_ns=record.took_ns)
        elif isinstance(event, ToolInvoked):
            start_tool(spans, at, step=event.step, call=event.call)
        elif isinstance(event, ToolReturned):
            end_tool(spans, at, event.result, took_ns=record.took_ns)
        elif isinstance(event, AttemptFinished):
            state.completed = finish_attempt(spans, at, passed=event.passed, score=event.score, steps=event.steps,
                                             status=event.status)
            state.traces += 1
            del state.open[key]
        return state


def readable(span: SpanData, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The OpenTelemetry SDK's finished span for one ``SpanData``."""
    trace_id = int(span.trace_id, 16)
    flags = TraceFlags(TraceFlags.SAMPLED)
    context = SpanContext(trace_id, int(span.span_id, 16), is_remote=False, trace_flags=flags)
    parent = SpanContext(trace_id, int(span.parent_id, 16), is_remote=False, trace_flags=flags) \
        if span.parent_id else None
    status = Status(StatusCode.ERROR, span.error) if span.error else Status(
        StatusCode.OK if span.ok else StatusCode.UNSET)
    kind = SpanKind.CLIENT if span.kind == "client" else SpanKind.INTERNAL
    return ReadableSpan(span.name, context=context, parent=parent, resource=resource,
                        attributes=span.attributes,
                        kind=kind, status=status, start_time=span.start_ns, end_time=span.end_ns,
                        instrumentation_scope=scope)


def traces_endpoint(url: str) -> str:
    """The OTLP/HTTP traces URL of an endpoint: a bare ``http://host:4318`` gets ``/v1/traces``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ExportFailed(f"OTLP endpoint {scrub(url)!r} is not an http(s) URL (e.g. http://127.0.0.1:4318)")
    register_url(url)  # credentials in the URL never reach an error line
    return url if parts.path.strip("/") else url.rstrip("/") + TRACES_PATH


def otlp_exporter(url: str, timeout_s: float = 10.0) -> OTLPSpanExporter:
    """An OTLP/HTTP (protobuf) span exporter to ``url`` (see ``traces_endpoint``)."""
    return OTLPSpanExporter(endpoint=traces_endpoint(url), timeout=timeout_s)


class _Captured(logging.Handler):
    """Keeps the exporter's log records instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record."""
        self.records.append(record)


@contextmanager
def quiet_exporter() -> Iterator[_Captured]:
    """Route the OTLP exporter's log lines (retries, failures) to a capture: hx reports a failure itself, once."""
    logger = logging.getLogger(EXPORTER_LOGGER)
    captured, propagate = _Captured(), logger.propagate
    logger.addHandler(captured)
    logger.propagate = False
    try:
        yield captured
    finally:
        logger.removeHandler(captured)
        logger.propagate = propagate


def failure_cause(records: list[logging.LogRecord]) -> str:
    """Why an export failed, from the exporter's captured log lines (the first reason given)."""
    for record in records:
        message = record.getMessage()
        for marker, end in (("reason: ", None), ("Transient error ", " encountered")):
            if marker in message:
                cause = message.split(marker, 1)[1]
                cause = cause.split(end, 1)[0] if end else cause
                if "NewConnectionError" in cause or "Connection refused" in cause:
                    return "could not connect"  # urllib3's whole retry chain says no more than this
                return scrub(" ".join(cause.split()))[:160]
    return "not taken before --otlp-timeout ran out" if records else "refused"


class SpanExportRunner(ProjectionRunner[OtelState]):
    """A runner of the ``otel`` projection that exports each completed trace, before any checkpoint covers it.

    Completed spans are exported in batches of ``batch_spans`` (each trace whole), at every
    checkpoint, and, with ``live`` set (following the log), as soon as an attempt finishes.
    """

    def __init__(self, log: EventLog, projection: OtelSpans, exporter: SpanExporter, *, target: str = "exporter",
                 batch_spans: int = 512, live: bool = False, checkpoint_every: int | None = None,
                 project: str = "") -> None:
        super().__init__(log, projection, checkpoint_every=checkpoint_every)
        self.exporter = exporter
        self.target = target
        """Where spans go, for messages (an endpoint URL is scrubbed of credentials)."""
        self.batch_spans = batch_spans
        self.live = live
        self.project = project
        """The project of every span; empty: each run's own (``OtelState.projects``, else ``hx``)."""
        self.exported_spans = 0
        self.exported_traces = 0
        self._pending: list[tuple[SpanData, str]] = []
        """Completed spans with their project."""
        self._pending_traces = 0
        self._resources: dict[str, Resource] = {}
        self._scope = InstrumentationScope(SCOPE, str(projection.version))

    def resource(self, project: str) -> Resource:
        """The resource of a project's spans (one per project: a ReadableSpan carries its own)."""
        found = self._resources.get(project)
        if found is None:
            found = self._resources[project] = Resource.create({"service.name": "hx", PROJECT: project})
        return found

    def apply(self, record: Record) -> bool:
        """Fold one record; queue the trace it completes, and export when the batch is full (or live)."""
        applied = super().apply(record)
        if applied and record.type == AttemptFinished.TYPE and self.state.completed:
            run = str(self.state.completed[-1].attributes.get("hx.run.id", ""))
            project = self.project or self.state.projects.get(run, DEFAULT_PROJECT)
            self._pending.extend((span, project) for span in self.state.completed)
            self._pending_traces += 1
            if self.live or len(self._pending) >= self.batch_spans:
                self.flush()
        return applied

    def flush(self) -> None:
        """Export every queued span; ``ExportFailed`` (spans kept queued) when the exporter fails."""
        if not self._pending:
            return
        spans = [readable(s, self.resource(project), self._scope) for s, project in self._pending]
        with quiet_exporter() as captured:
            result = self.exporter.export(spans)
        if result != SpanExportResult.SUCCESS:
            raise ExportFailed(f"exporting {len(spans)} span(s) to {scrub(self.target)} failed "
                               f"({failure_cause(captured.records)}); the position was not checkpointed past them, "
                               f"so running again resends them")
        self.exported_spans += len(spans)
        self.exported_traces += self._pending_traces
        self._pending, self._pending_traces = [], 0

    async def checkpoint(self) -> Checkpoint:
        """Export what is queued, then checkpoint (a checkpoint never covers an unexported span)."""
        self.flush()
        return await super().checkpoint()
