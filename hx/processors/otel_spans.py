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

Spans go to the global tracer provider (``opentelemetry.trace.set_tracer_provider``);
with none configured they are no-ops. Span times come from the wall clock, which is
fine: spans are not event bodies. Message contents are not recorded. The requested model
is not part of the before_model event, so unless ``request_model`` names it the chat
span takes the name and request model of the model that answered (under fallback, the
fallback's).

Span names and attributes come from ``projections.genai``, shared with the ``otel``
projection that builds the same spans from the log afterwards (``hx projections run otel``).

Attach with ``attach(OtelSpanEmitter.accepted_hooks(), OtelSpanEmitter())``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from hx.harness.processor import POST, Processor
from projections.genai import (
    ERROR_TYPE,
    PROVIDER,
    REQUEST_MODEL,
    Attributes,
    agent_attributes,
    agent_span_name,
    chat_attributes,
    chat_span_name,
    response_attributes,
    split_spec,
    tool_attributes,
    tool_span_name,
    verdict_attributes,
)
from schemas.hooks import AfterModel, AfterTool, BeforeModel, BeforeTool, TaskEnd, TaskStart

SpanHook = TaskStart | BeforeModel | AfterModel | BeforeTool | AfterTool | TaskEnd


class OtelSpanEmitter(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Emit invoke_agent, chat and execute_tool spans for one attempt."""

    name: ClassVar[str] = "otel_spans"
    _order: ClassVar[int] = POST  # observe what the other processors leave
    dimension: ClassVar[str] = "D8"

    agent_name: str = "hx"
    """``gen_ai.agent.name`` and the agent span's name suffix."""
    request_model: str = ""
    """The model spec requested, when known in advance (otherwise the one that answered)."""
    scope: str = "hx"
    """Instrumentation scope name of the tracer."""

    def __post_init__(self) -> None:
        self._tracer = trace.get_tracer(self.scope)
        self._agent: Span | None = None
        self._chat: Span | None = None
        self._tools: dict[str, Span] = {}

    def _child(self, name: str, kind: SpanKind, attributes: Attributes) -> Span:
        context = trace.set_span_in_context(self._agent) if self._agent is not None else None
        return self._tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    async def process(self, event: SpanHook) -> AsyncIterator[SpanHook]:
        """Open or close the span the hook marks; the event passes unchanged."""
        if isinstance(event, TaskStart):
            self._start_agent(event)
        elif isinstance(event, BeforeModel):
            self._start_chat(event)
        elif isinstance(event, AfterModel):
            self._end_chat(event)
        elif isinstance(event, BeforeTool):
            self._start_tool(event)
        elif isinstance(event, AfterTool):
            self._end_tool(event)
        else:
            self._end_agent(event)
        yield event

    def _start_agent(self, event: TaskStart) -> None:
        self._agent = self._tracer.start_span(agent_span_name(self.agent_name), kind=SpanKind.INTERNAL,
                                              attributes=agent_attributes(self.agent_name, event.task.id,
                                                                          event.task.benchmark))

    def _start_chat(self, event: BeforeModel) -> None:
        if self._chat is not None:  # the previous call never reached after_model
            self._chat.set_status(Status(StatusCode.ERROR, "no response reached after_model"))
            self._chat.end()
        name = chat_span_name(split_spec(self.request_model)[1] if self.request_model else "")
        self._chat = self._child(name, SpanKind.CLIENT, chat_attributes(event.step, self.request_model))

    def _end_chat(self, event: AfterModel) -> None:
        span, self._chat = self._chat, None
        if span is None:
            return
        provider, model = split_spec(event.model)
        if not self.request_model:
            span.update_name(chat_span_name(model))
            span.set_attribute(REQUEST_MODEL, model)
            span.set_attribute(PROVIDER, provider)
        span.set_attributes(response_attributes(model, event.stop_reason, len(event.tool_calls),
                                                event.usage.input_tokens, event.usage.output_tokens))
        span.end()

    def _start_tool(self, event: BeforeTool) -> None:
        call = event.call
        old = self._tools.pop(call.id, None)
        if old is not None:
            old.end()
        self._tools[call.id] = self._child(tool_span_name(call.name), SpanKind.INTERNAL,
                                           tool_attributes(call.name, call.id, event.step))
        self._tools[call.id].set_attribute("hx.tool.approved", event.approved)

    def _end_tool(self, event: AfterTool) -> None:
        span = self._tools.pop(event.call.id, None)
        if span is None:
            return
        if event.result.is_error:
            span.set_attribute(ERROR_TYPE, "tool_error")
            span.set_status(Status(StatusCode.ERROR, event.result.output[:200]))
        span.end()

    def _end_agent(self, event: TaskEnd) -> None:
        unfinished = [*self._tools.values(), *([self._chat] if self._chat is not None else [])]
        for span in unfinished:
            span.set_status(Status(StatusCode.ERROR, f"attempt ended ({event.status}) before the span completed"))
            span.end()
        self._tools.clear()
        self._chat = None
        agent, self._agent = self._agent, None
        if agent is None:
            return
        agent.set_attributes(verdict_attributes(event.passed, event.score, event.steps, event.status))
        if event.status in ("interrupted", "infra_failure"):
            agent.set_status(Status(StatusCode.ERROR, event.status))
        agent.end()
