"""D8 ``otel_spans``: OpenTelemetry spans for each attempt, following the GenAI semantic conventions.

Failure addressed: agents that are opaque to the operator's usual tooling. The event
log is hx's own record; this processor mirrors an attempt into the tracing backend a
team already runs (Jaeger, Tempo, Honeycomb ...), so a slow model call, a failing tool
or an interrupted attempt shows up next to the rest of their services:

- ``invoke_agent {agent}`` from task_start to task_end (``gen_ai.operation.name``
  ``invoke_agent``, ``gen_ai.agent.name``; hx's verdict as ``hx.*`` attributes; error
  status when the attempt was interrupted or failed for infrastructure reasons);
- ``chat {model}`` from before_model to after_model, a child of the agent span
  (``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.response.finish_reasons``, and ``gen_ai.usage.*`` when after_model carries
  usage);
- ``execute_tool {tool}`` from before_tool to after_tool, a child of the agent span
  (``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type``; error status
  for an error result).

Spans are built by ``projections.attempt_spans``, the builder the ``otel`` projection
(``hx projections run otel``) also uses, so a live span and a rebuilt one have the same
name, attributes (``session.id`` = the run id included), kind, parent and status; their
times differ by the time between a hook and its event. The attempt's address, harness and
main model come from the running attempt (``hx.runtime.services``). Differences that remain:
the hooks see one call per model turn, so a retried or fallen-back call is one span live and
one per try on the log; ``gen_ai.response.model`` is the answering model's name live (hooks
do not carry the provider's own model id); the project is the tracer provider's resource.
Each child span is emitted when it closes, the attempt's when the attempt ends, through the
global tracer provider (``opentelemetry.trace.set_tracer_provider``); with none configured
they are no-ops. With ``content`` the spans carry the messages and tool input/output,
scrubbed of secrets (``streams.redaction.scrub``).

Attach with ``attach(OtelSpanEmitter.accepted_hooks(), OtelSpanEmitter())``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import ClassVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from hx.harness.processor import POST, Processor
from hx.runtime.services import current_services
from projections.attempt_spans import (
    AGENT,
    AttemptSpans,
    SpanData,
    end_chat,
    end_tool,
    finish_attempt,
    open_attempt,
    start_chat,
    start_tool,
    take_closed,
)
from schemas.hooks import AfterModel, AfterTool, BeforeModel, BeforeTool, TaskEnd, TaskStart
from schemas.lifecycle import AttemptStarted

SpanHook = TaskStart | BeforeModel | AfterModel | BeforeTool | AfterTool | TaskEnd


class OtelSpanEmitter(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Emit invoke_agent, chat and execute_tool spans for one attempt."""

    name: ClassVar[str] = "otel_spans"
    _order: ClassVar[int] = POST  # observe what the other processors leave
    dimension: ClassVar[str] = "D8"

    agent_name: str = AGENT
    """``gen_ai.agent.name`` and the agent span's name suffix (the ``otel`` projection's is ``hx``)."""
    request_model: str = ""
    """The model spec requested; empty: the running attempt's main model."""
    scope: str = "hx"
    """Instrumentation scope name of the tracer."""
    content: bool = False
    """Add message content and tool input/output to the spans (secrets scrubbed)."""

    def __post_init__(self) -> None:
        self._tracer = trace.get_tracer(self.scope)
        self._spans: AttemptSpans | None = None
        self._params: dict[str, object] = {}
        self._model = self.request_model
        self._root: Span | None = None

    async def process(self, event: SpanHook) -> AsyncIterator[SpanHook]:
        """Feed the hook to the span builder; emit the spans it closed. The event passes unchanged."""
        now = time.time_ns()
        if isinstance(event, TaskStart):
            self._start(event, now)
        elif (spans := self._spans) is not None:
            if isinstance(event, BeforeModel):
                start_chat(spans, now, step=event.step, spec=self._model, params=self._params,
                           messages=event.messages)
            elif isinstance(event, AfterModel):
                end_chat(spans, now, spec=event.model or self._model, stop_reason=event.stop_reason,
                         content=event.content, tool_calls=event.tool_calls, input_tokens=event.usage.input_tokens,
                         output_tokens=event.usage.output_tokens)
            elif isinstance(event, BeforeTool):
                if event.approved:  # a blocked call never runs: no tool.invoked on the log, no span
                    start_tool(spans, now, step=event.step, call=event.call)
            elif isinstance(event, AfterTool):
                end_tool(spans, now, event.result)
            else:
                self._spans = None
                self._emit(finish_attempt(spans, now, passed=event.passed, score=event.score, steps=event.steps,
                                          status=event.status))
            if self._spans is not None:
                self._emit(take_closed(self._spans))
        yield event

    def _start(self, event: TaskStart, now: int) -> None:
        services = current_services()
        started = services.started if services is not None else None
        if services is not None:
            model, params = services.request()
            self._model, self._params = self.request_model or model, params
        if started is None:  # outside a run (a processor kit): an attempt 0 of no run
            started = AttemptStarted(run_id="", round=0, task_id=event.task.id, attempt=0)
        self._spans = spans = open_attempt(started.run_id, started.round, started.task_id, started.attempt, now,
                                           model=self._model, harness_digest=started.harness_digest,
                                           benchmark=event.task.benchmark, content=self.content,
                                           agent=self.agent_name)
        agent = spans.agent
        self._root = self._tracer.start_span(agent.name, kind=SpanKind.INTERNAL, attributes=agent.attributes,
                                             start_time=agent.start_ns)

    def _emit(self, spans: list[SpanData]) -> None:
        """Hand closed spans to the tracer provider with the builder's times, attributes and status.

        Ids are the provider's: the children hang under the attempt's span, opened at task_start.
        """
        for data in spans:
            root = self._root
            if not data.parent_id and root is not None:
                span, self._root = root, None
                span.set_attributes(data.attributes)
            else:
                context = trace.set_span_in_context(root) if root is not None else None
                span = self._tracer.start_span(data.name, context=context, attributes=data.attributes,
                                               kind=SpanKind.CLIENT if data.kind == "client" else SpanKind.INTERNAL,
                                               start_time=data.start_ns)
            if data.error:
                span.set_status(Status(StatusCode.ERROR, data.error))
            elif data.ok:
                span.set_status(Status(StatusCode.OK))
            span.end(end_time=data.end_ns)
