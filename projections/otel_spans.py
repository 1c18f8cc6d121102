"""The ``otel`` projection: every attempt on the log as an OpenTelemetry trace (GenAI semantic conventions).

The fold turns an attempt's lifecycle, model and tool events into spans, one trace per
attempt:

- a root ``invoke_agent hx`` span from ``attempt.started`` to ``attempt.finished``, with the
  run, round, task and attempt as ``hx.*`` attributes and hx's verdict;
- a ``chat {model}`` child per model call, from ``model.request`` to ``model.response`` (or
  ``model.error``), with ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.usage.*``;
- an ``execute_tool {tool}`` child per tool call, from ``tool.invoked`` to ``tool.returned``.

Span times are the events' ``Hx-Time`` headers (events written in one frame share one
time). Trace and span ids are derived from the attempt's address and the events'
positions, so the same log always yields the same ids: a trace exported twice (after a
crash between export and checkpoint) is the same trace. Names and attributes come from
``projections.genai``, shared with the live ``otel_spans`` processor. No message content,
tool input or output, or model URL goes into a span.

The fold stays pure: the state holds the spans of the attempts still open, and
``completed``, the spans the last ``attempt.finished`` closed. ``SpanExportRunner`` hands
those to an OpenTelemetry ``SpanExporter`` (OTLP, in-memory, console) and flushes the
exporter before every checkpoint, so a checkpoint never covers a span that was not
exported (delivery is at least once).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar, Literal
from urllib.parse import urlsplit

import msgspec
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from projections.base import Projection
from projections.errors import ExportFailed
from projections.genai import (
    ERROR_TYPE,
    PROVIDER,
    REQUEST_MODEL,
    Attributes,
    agent_attributes,
    agent_span_name,
    attempt_attributes,
    chat_attributes,
    chat_span_name,
    request_parameter_attributes,
    response_attributes,
    split_spec,
    tool_attributes,
    tool_span_name,
    verdict_attributes,
)
from projections.runner import Checkpoint, ProjectionRunner
from projections.trace_store import attempt_key
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import ToolInvoked, ToolReturned
from streams.log import EventLog
from streams.redaction import register_url, scrub
from streams.topology import TraceAddress

AGENT = "hx"
"""``gen_ai.agent.name`` of every attempt's root span."""
SCOPE = "hx.projections.otel"
TRACES_PATH = "/v1/traces"
EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
"""The parent of the OTLP exporters' loggers (``...proto.http.trace_exporter``, ``...common``)."""


class SpanData(msgspec.Struct, kw_only=True):
    """One span as the projection keeps it (ids as hex, times in ns since the epoch)."""

    trace_id: str
    span_id: str
    parent_id: str = ""
    """Empty for the root span."""
    name: str
    kind: Literal["internal", "client"] = "internal"
    start_ns: int
    end_ns: int = 0
    attributes: Attributes = {}
    error: str = ""
    """Non-empty: the span ended in error, with this description."""


class AttemptSpans(msgspec.Struct, kw_only=True):
    """The spans of one attempt still on the way: the root, the open chat and tool spans, the closed ones."""

    agent: SpanData
    chat: SpanData | None = None
    tools: dict[str, SpanData] = {}
    """Open tool spans by tool call id."""
    closed: list[SpanData] = []


class OtelState(msgspec.Struct, kw_only=True):
    """Open attempts by key (``run/round/task/attempt``), the last completed trace, and how many completed."""

    open: dict[str, AttemptSpans] = {}
    completed: list[SpanData] = []
    """The spans the last ``attempt.finished`` completed (its whole trace, root last)."""
    traces: int = 0


def _hex(*parts: str, size: int) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[: 2 * size]


def _close(span: SpanData, end_ns: int, error: str = "") -> SpanData:
    span.end_ns = max(end_ns, span.start_ns)
    if error:
        span.error = error
    return span


class OtelSpans(Projection[OtelState]):
    """GenAI spans of every attempt: ``invoke_agent`` with ``chat`` and ``execute_tool`` children."""

    name: ClassVar[str] = "otel"
    version: ClassVar[int] = 1
    reads = frozenset({AttemptStarted.TYPE, AttemptFinished.TYPE, ModelRequest.TYPE, ModelResponse.TYPE,
                       ModelError.TYPE, ToolInvoked.TYPE, ToolReturned.TYPE})
    state_type = OtelState

    def initial(self) -> OtelState:
        """No attempt open, none completed."""
        return OtelState()

    def fold(self, state: OtelState, record: Record) -> OtelState:
        """Open, annotate or close the span the record marks."""
        if state.completed:
            state.completed = []
        try:
            addr = TraceAddress.parse(record.subject)
        except ValueError:
            return state
        if addr.round is None or addr.task is None or addr.attempt is None:
            return state
        key = attempt_key(addr.run, addr.round, addr.task, addr.attempt)
        event = record.event
        if isinstance(event, AttemptStarted):
            state.open[key] = AttemptSpans(agent=self._agent(key, addr, event, record.time_ns))
            return state
        spans = state.open.get(key)
        if spans is None:
            return state  # the attempt began before this projection's first event (--from): no root to hang it on
        pos = f"{record.seq}.{record.index}"
        if isinstance(event, ModelRequest):
            if spans.chat is not None:
                spans.closed.append(_close(spans.chat, record.time_ns, "no response before the next request"))
            model = split_spec(event.model)[1]
            attributes = {**chat_attributes(event.step, event.model), **request_parameter_attributes(event.params),
                          "hx.model.role": event.role, "hx.model.try": event.try_index}
            spans.chat = SpanData(trace_id=spans.agent.trace_id, span_id=_hex(key, "chat", pos, size=8),
                                  parent_id=spans.agent.span_id, name=chat_span_name(model), kind="client",
                                  start_ns=record.time_ns, attributes=attributes)
        elif isinstance(event, ModelResponse | ModelError):
            chat, spans.chat = spans.chat, None
            if chat is None:
                return state
            if isinstance(event, ModelResponse):
                model = event.model_version or split_spec(event.model)[1]
                chat.attributes.update(response_attributes(model, event.stop_reason, len(event.tool_calls),
                                                           event.usage.input_tokens, event.usage.output_tokens))
                spans.closed.append(_close(chat, record.time_ns))
            else:
                chat.attributes[ERROR_TYPE] = event.kind
                spans.closed.append(_close(chat, record.time_ns, f"model error: {event.kind}"))
        elif isinstance(event, ToolInvoked):
            call = event.call
            old = spans.tools.pop(call.id, None)
            if old is not None:
                spans.closed.append(_close(old, record.time_ns, "no result before the call was made again"))
            spans.tools[call.id] = SpanData(
                trace_id=spans.agent.trace_id, span_id=_hex(key, "tool", pos, size=8), parent_id=spans.agent.span_id,
                name=tool_span_name(call.name), start_ns=record.time_ns,
                attributes=tool_attributes(call.name, call.id, event.step))
        elif isinstance(event, ToolReturned):
            tool = spans.tools.pop(event.result.call_id, None)
            if tool is None:
                return state
            error = ""
            if event.result.is_error:
                tool.attributes[ERROR_TYPE] = "tool_error"
                error = scrub(event.result.output[:200]) or "tool error"
            spans.closed.append(_close(tool, record.time_ns, error))
        elif isinstance(event, AttemptFinished):
            self._finish(state, key, spans, event, record.time_ns)
        return state

    @staticmethod
    def _agent(key: str, addr: TraceAddress, event: AttemptStarted, time_ns: int) -> SpanData:
        assert addr.round is not None and addr.task is not None and addr.attempt is not None
        attributes = {**agent_attributes(AGENT, addr.task), **attempt_attributes(addr.run, addr.round, addr.task,
                                                                                addr.attempt)}
        if event.model:
            provider, model = split_spec(event.model)
            attributes[REQUEST_MODEL] = model
            if provider:
                attributes[PROVIDER] = provider
        if event.harness_digest:
            attributes["hx.harness.digest"] = event.harness_digest
        return SpanData(trace_id=_hex("hx-trace", key, size=16), span_id=_hex(key, "agent", size=8),
                        name=agent_span_name(AGENT), start_ns=time_ns, attributes=attributes)

    @staticmethod
    def _finish(state: OtelState, key: str, spans: AttemptSpans, event: AttemptFinished, time_ns: int) -> None:
        unfinished = [*spans.tools.values(), *([spans.chat] if spans.chat is not None else [])]
        for span in unfinished:
            spans.closed.append(_close(span, time_ns, f"attempt ended ({event.status}) before the span completed"))
        agent = spans.agent
        agent.attributes.update(verdict_attributes(event.passed, event.score, event.steps, event.status))
        error = event.status if event.status in ("interrupted", "infra_failure") else ""
        state.completed = [*spans.closed, _close(agent, time_ns, error)]
        state.traces += 1
        del state.open[key]


def readable(span: SpanData, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The OpenTelemetry SDK's finished span for one ``SpanData``."""
    trace_id = int(span.trace_id, 16)
    flags = TraceFlags(TraceFlags.SAMPLED)
    context = SpanContext(trace_id, int(span.span_id, 16), is_remote=False, trace_flags=flags)
    parent = SpanContext(trace_id, int(span.parent_id, 16), is_remote=False, trace_flags=flags) \
        if span.parent_id else None
    status = Status(StatusCode.ERROR, span.error) if span.error else Status(StatusCode.UNSET)
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
                 batch_spans: int = 512, live: bool = False, checkpoint_every: int = 200_000) -> None:
        super().__init__(log, projection, checkpoint_every=checkpoint_every)
        self.exporter = exporter
        self.target = target
        """Where spans go, for messages (an endpoint URL is scrubbed of credentials)."""
        self.batch_spans = batch_spans
        self.live = live
        self.exported_spans = 0
        self.exported_traces = 0
        self._pending: list[SpanData] = []
        self._pending_traces = 0
        self._resource = Resource.create({"service.name": "hx"})
        self._scope = InstrumentationScope(SCOPE, str(projection.version))

    def apply(self, record: Record) -> bool:
        """Fold one record; queue the trace it completes, and export when the batch is full (or live)."""
        applied = super().apply(record)
        if applied and record.type == AttemptFinished.TYPE and self.state.completed:
            self._pending.extend(self.state.completed)
            self._pending_traces += 1
            if self.live or len(self._pending) >= self.batch_spans:
                self.flush()
        return applied

    def flush(self) -> None:
        """Export every queued span; ``ExportFailed`` (spans kept queued) when the exporter fails."""
        if not self._pending:
            return
        spans = [readable(s, self._resource, self._scope) for s in self._pending]
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
