"""One attempt's spans, built one way for both writers: the ``otel`` projection and the live ``otel_spans`` processor.

The projection feeds this builder log records (with each event's own time, ``Record.time_ns``);
the processor feeds it hook events (with the wall clock at the hook). Both get the same span
names, attributes, kinds, parents, ids and statuses:

- ``invoke_agent hx``: the attempt, from ``attempt.started`` to ``attempt.finished``;
- ``chat {model}``: one model call, a child of the attempt (kind client);
- ``execute_tool {tool}``: one tool call, a child of the attempt.

Every span carries ``session.id`` = the run id (OpenInference: Phoenix groups a session by it)
and ``openinference.span.kind`` (AGENT, LLM, TOOL). Span ids are derived from the attempt's
address and the call's number in it (the n-th chat, the n-th tool call), so the same attempt
gives the same ids, live or rebuilt, however often it is exported.

The attempt's status is its verdict (``verdict_status``): passed -> OK; interrupted or
infra_failure -> ERROR with the status; otherwise (not passed) -> ERROR ``failed: score S``.

With ``content`` the spans also carry the model's input messages and output and the tools'
input and output (OpenInference ``llm.input_messages.N.message.*``, ``input.value`` ...),
each text through ``streams.redaction.scrub``. Without it, no message content, tool input or
output goes into a span; a model URL never does (``split_spec`` drops it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Literal

import msgspec

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
    response_model,
    split_spec,
    tool_attributes,
    tool_span_name,
    verdict_attributes,
)
from projections.trace_store import attempt_key
from schemas.messages import Message, ToolCall, ToolResult
from streams.redaction import scrub

AGENT = "hx"
"""``gen_ai.agent.name`` of every attempt's root span."""
SESSION_ID = "session.id"
"""OpenInference's session attribute (Phoenix's sessions view groups spans by it): the run id."""
SPAN_KIND = "openinference.span.kind"
INPUT_VALUE, INPUT_MIME = "input.value", "input.mime_type"
OUTPUT_VALUE, OUTPUT_MIME = "output.value", "output.mime_type"
INPUT_MESSAGES, OUTPUT_MESSAGES = "llm.input_messages", "llm.output_messages"
JSON_MIME = "application/json"
UNFINISHED = ("interrupted", "infra_failure")
"""Statuses of an attempt that did not run to a verdict: its span's error names the status."""


class SpanData(msgspec.Struct, kw_only=True):
    """One span as the builder keeps it (ids as hex, times in ns since the epoch)."""

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
    ok: bool = False
    """True: the span ended with status OK (the attempt passed); neither: status unset."""


class AttemptSpans(msgspec.Struct, kw_only=True):
    """The spans of one attempt still on the way: the root, the open chat and tool spans, the closed ones."""

    key: str = ""
    """The attempt's address, ``run/round/task/attempt`` (span ids derive from it)."""
    agent: SpanData
    chat: SpanData | None = None
    tools: dict[str, SpanData] = {}
    """Open tool spans by tool call id."""
    closed: list[SpanData] = []
    calls: int = 0
    """Chat and tool spans opened so far: the next one's number, for its id."""
    last_start_ns: int = 0
    """The latest child start: a child never starts before it (old logs share one time per frame)."""
    content: bool = False
    """Carry message content and tool input/output (scrubbed)."""
    ordinal: int = -1
    """With content, from the log: the ordinal of ``conversation`` in the attempt (``schemas.history``)."""
    conversation: tuple[Message, ...] = ()


def span_hex(*parts: str, size: int) -> str:
    """A stable id of ``size`` bytes (hex) from the parts."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[: 2 * size]


def task_benchmark(task_id: str, benchmark: str = "") -> str:
    """The benchmark of a task: as given, else its id's prefix (``twx:coin/...`` -> ``twx``)."""
    return benchmark or (task_id.partition(":")[0] if ":" in task_id else "")


def open_attempt(run: str, round: int, task: str, attempt: int, at_ns: int, *, model: str = "",
                 harness_digest: str = "", benchmark: str = "", content: bool = False,
                 agent: str = AGENT) -> AttemptSpans:
    """The spans of an attempt that just started (``model`` is the main model's spec as shown)."""
    key = attempt_key(run, round, task, attempt)
    attributes = {**agent_attributes(agent, task, task_benchmark(task, benchmark)),
                  **attempt_attributes(run, round, task, attempt), SESSION_ID: run, SPAN_KIND: "AGENT"}
    if model:
        provider, name = split_spec(model)
        attributes[REQUEST_MODEL] = name
        if provider:
            attributes[PROVIDER] = provider
    if harness_digest:
        attributes["hx.harness.digest"] = harness_digest
    root = SpanData(trace_id=span_hex("hx-trace", key, size=16), span_id=span_hex(key, "agent", size=8),
                    name=agent_span_name(agent), start_ns=at_ns, attributes=attributes)
    return AttemptSpans(key=key, agent=root, content=content)


def _child(spans: AttemptSpans, kind: str, name: str, at_ns: int, attributes: Attributes,
           span_kind: Literal["internal", "client"]) -> SpanData:
    start = max(at_ns, spans.last_start_ns + 1) if spans.last_start_ns else at_ns
    spans.last_start_ns = start
    span_id = span_hex(spans.key, kind, str(spans.calls), size=8)
    spans.calls += 1
    attributes[SESSION_ID] = str(spans.agent.attributes["hx.run.id"])
    return SpanData(trace_id=spans.agent.trace_id, span_id=span_id, parent_id=spans.agent.span_id, name=name,
                    kind=span_kind, start_ns=start, attributes=attributes)


def _close(spans: AttemptSpans, span: SpanData, end_ns: int, error: str = "") -> None:
    span.end_ns = max(end_ns, span.start_ns)
    if error:
        span.error = error
    spans.closed.append(span)


def _messages(prefix: str, messages: Sequence[Message]) -> Attributes:
    """OpenInference's flattened messages, every text scrubbed."""
    out: Attributes = {}
    for i, m in enumerate(messages):
        out[f"{prefix}.{i}.message.role"] = m.role
        if m.content:
            out[f"{prefix}.{i}.message.content"] = scrub(m.content)
        for j, call in enumerate(m.tool_calls):
            base = f"{prefix}.{i}.message.tool_calls.{j}.tool_call"
            out[f"{base}.id"] = call.id
            out[f"{base}.function.name"] = call.name
            out[f"{base}.function.arguments"] = scrub(json.dumps(call.input, sort_keys=True))
    return out


def start_chat(spans: AttemptSpans, at_ns: int, *, step: int, spec: str, role: str = "main", try_index: int = 0,
               params: dict[str, object] | None = None, messages: Sequence[Message] | None = None) -> None:
    """Open a ``chat`` span for a model call to ``spec`` (closing a previous one that never got its answer)."""
    if spans.chat is not None:
        _close(spans, spans.chat, at_ns, "no response before the next request")
    attributes = {**chat_attributes(step, spec), **request_parameter_attributes(params or {}),
                  "hx.model.role": role, "hx.model.try": try_index, SPAN_KIND: "LLM"}
    if spans.content and messages is not None:
        attributes.update(_messages(INPUT_MESSAGES, messages))
        attributes[INPUT_VALUE] = json.dumps([{"role": m.role, "content": scrub(m.content)} for m in messages])
        attributes[INPUT_MIME] = JSON_MIME
    spans.chat = _child(spans, "chat", chat_span_name(split_spec(spec)[1]), at_ns, attributes, "client")


def end_chat(spans: AttemptSpans, at_ns: int, *, spec: str, model_version: str = "", stop_reason: str = "",
             content: str = "", tool_calls: Sequence[ToolCall] = (), input_tokens: int = 0,
             output_tokens: int = 0, took_ns: int = 0) -> None:
    """Close the open ``chat`` span with the model's answer (``took_ns``: the call's measured duration)."""
    chat, spans.chat = spans.chat, None
    if chat is None:
        return
    if took_ns:
        chat.start_ns = at_ns - took_ns
    chat.attributes.update(response_attributes(response_model(model_version, spec), stop_reason, len(tool_calls),
                                               input_tokens, output_tokens))
    if spans.content:
        chat.attributes.update(_messages(OUTPUT_MESSAGES, [Message(role="assistant", content=content,
                                                                   tool_calls=tuple(tool_calls))]))
        chat.attributes[OUTPUT_VALUE] = scrub(content)
    _close(spans, chat, at_ns)


def fail_chat(spans: AttemptSpans, at_ns: int, kind: str, took_ns: int = 0) -> None:
    """Close the open ``chat`` span as failed (a provider error of ``kind``)."""
    chat, spans.chat = spans.chat, None
    if chat is None:
        return
    if took_ns:
        chat.start_ns = at_ns - took_ns
    chat.attributes[ERROR_TYPE] = kind
    _close(spans, chat, at_ns, f"model error: {kind}")


def start_tool(spans: AttemptSpans, at_ns: int, *, step: int, call: ToolCall) -> None:
    """Open an ``execute_tool`` span for ``call`` (closing an earlier one of the same id that never returned)."""
    old = spans.tools.pop(call.id, None)
    if old is not None:
        _close(spans, old, at_ns, "no result before the call was made again")
    attributes = {**tool_attributes(call.name, call.id, step), SPAN_KIND: "TOOL"}
    if spans.content:
        attributes[INPUT_VALUE] = scrub(json.dumps(call.input, sort_keys=True))
        attributes[INPUT_MIME] = JSON_MIME
    spans.tools[call.id] = _child(spans, "tool", tool_span_name(call.name), at_ns, attributes, "internal")


def end_tool(spans: AttemptSpans, at_ns: int, result: ToolResult, took_ns: int = 0) -> None:
    """Close the ``execute_tool`` span of the call ``result`` answers."""
    tool = spans.tools.pop(result.call_id, None)
    if tool is None:
        return
    if took_ns:
        tool.start_ns = at_ns - took_ns
    if spans.content:
        tool.attributes[OUTPUT_VALUE] = scrub(result.output)
    error = ""
    if result.is_error:
        tool.attributes[ERROR_TYPE] = "tool_error"
        error = scrub(result.output[:200]) or "tool error"
    _close(spans, tool, at_ns, error)


def verdict_status(passed: bool, score: float, status: str) -> str:
    """The attempt span's error description ("" when it passed): the status if it did not finish, else the score."""
    if status in UNFINISHED:
        return status
    if passed:
        return ""
    return f"failed: score {score:g}" if status == "completed" else f"failed ({status}): score {score:g}"


def finish_attempt(spans: AttemptSpans, at_ns: int, *, passed: bool, score: float, steps: int,
                   status: str) -> list[SpanData]:
    """Close every span still open and the attempt's own; return all the closed spans not yet taken, root last."""
    unfinished = [*spans.tools.values(), *([spans.chat] if spans.chat is not None else [])]
    spans.tools, spans.chat = {}, None
    for span in unfinished:
        _close(spans, span, at_ns, f"attempt ended ({status}) before the span completed")
    agent = spans.agent
    agent.attributes.update(verdict_attributes(passed, score, steps, status))
    error = verdict_status(passed, score, status)
    agent.ok = not error
    agent.end_ns = max(at_ns, agent.start_ns)
    agent.error = error
    return [*take_closed(spans), agent]


def take_closed(spans: AttemptSpans) -> list[SpanData]:
    """The child spans closed since the last take (the live processor emits them as they close)."""
    closed, spans.closed = spans.closed, []
    return closed
