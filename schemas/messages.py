"""Value types carried inside events: chat messages, tools, tool calls, usage, log-probs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeVar

import msgspec

from schemas.event import JsonObject, Payload
from schemas.frozen import READING, FrozenDict, freeze

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(Payload, frozen=True, kw_only=True):
    """A model's request to call one tool."""

    id: str
    """Identifier the model gave the call, echoed by the result."""
    name: str
    """The tool's name."""
    input: JsonObject
    """Arguments, as JSON-compatible values: the shape is the tool's ``input_schema``, not hx's."""

    def __post_init__(self) -> None:
        # Frozen once here, when the value is made or replaced; as read from the log only where it enters a hook
        # payload again (see schemas.frozen).
        if not READING.depth:
            msgspec.structs.force_setattr(self, "input", freeze(self.input))


class ToolSchema(Payload, frozen=True, kw_only=True):
    """A tool offered to the model: name, description and JSON Schema of its input."""

    name: str
    description: str = ""
    input_schema: JsonObject = {}
    """A JSON Schema (open: JSON Schema is its own language)."""

    def __post_init__(self) -> None:
        # Frozen once here, when the value is made or replaced; as read from the log only where it enters a hook
        # payload again (see schemas.frozen).
        if not READING.depth:
            msgspec.structs.force_setattr(self, "input_schema", freeze(self.input_schema))


class ToolResult(Payload, frozen=True, kw_only=True):
    """What a tool returned for one call."""

    call_id: str
    name: str
    output: str
    is_error: bool = False
    data: JsonObject = {}
    """Structured extras (environment score, flags), kept out of the text the model sees: each tool and benchmark
    adapter has its own."""

    def __post_init__(self) -> None:
        # Frozen once here, when the value is made or replaced; as read from the log only where it enters a hook
        # payload again (see schemas.frozen).
        if not READING.depth:
            msgspec.structs.force_setattr(self, "data", freeze(self.data))


class Message(Payload, frozen=True, kw_only=True):
    """One chat message in a conversation."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls made by an assistant message."""
    tool_call_id: str | None = None
    """For a tool message: the call it answers."""
    name: str | None = None


Part = tuple[int, int] | Message
"""A span ``(start, stop)`` of the previous conversation, or one literal message."""


class History(Payload, frozen=True, kw_only=True):
    """A conversation logged as spans of its attempt's previous conversation plus new messages.

    See ``schemas.history``: the tracer writes it, ``schemas.history.resolve`` reads it back.
    """

    ordinal: int
    """This conversation's number within its attempt; it is rebuilt from number ``ordinal - 1``."""
    parts: tuple[Part, ...] = ()


class Usage(Payload, frozen=True, kw_only=True):
    """Token counts and cost of one model call."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0

    def plus(self, other: Usage) -> Usage:
        """The sum of two calls' (or totals') counts and costs."""
        return Usage(input_tokens=self.input_tokens + other.input_tokens,
                     output_tokens=self.output_tokens + other.output_tokens,
                     cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
                     cost_usd=round(self.cost_usd + other.cost_usd, 6))


def summed(usages: Iterable[Usage]) -> Usage:
    """The total of several calls' usage (zeros for none)."""
    total = Usage()
    for usage in usages:
        total = total.plus(usage)
    return total


class TopLogprob(Payload, frozen=True, kw_only=True):
    """An alternative the model considered at one position, with its log-probability."""

    token: str
    logprob: float


class TokenLogprob(Payload, frozen=True, kw_only=True):
    """Log-probability of one chosen token, or of one chosen option for choice-level policies."""

    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class TaskSpec(Payload, frozen=True, kw_only=True):
    """A task as the agent receives it."""

    id: str
    """Benchmark-qualified id, for example ``twx:coin:dev:17``."""
    instruction: str
    benchmark: str = ""
    split: str = ""
    seed: int = 0
    meta: JsonObject = {}
    """What the benchmark adapter knows of the task (game, variation, level...): each adapter has its own."""

    def __post_init__(self) -> None:
        # Frozen once here, when the value is made or replaced; as read from the log only where it enters a hook
        # payload again (see schemas.frozen).
        if not READING.depth:
            msgspec.structs.force_setattr(self, "meta", freeze(self.meta))


_JSON_FIELD: dict[type, str] = {ToolCall: "input", ToolSchema: "input_schema", ToolResult: "data", TaskSpec: "meta"}
"""The open JSON field of each value type that has one."""
_Live = TypeVar("_Live", ToolCall, ToolSchema, ToolResult, TaskSpec)


def refrozen(value: _Live) -> _Live:
    """``value`` (a tool call, tool schema, tool result or task) with its JSON field frozen: a value read from the
    log, as a replay feeds it to the run loop, is frozen where it enters a hook payload; a frozen one is returned
    as is."""
    field = _JSON_FIELD.get(type(value))
    if field is None or type(getattr(value, field)) is FrozenDict:
        return value
    return msgspec.structs.replace(value, **{field: dict(getattr(value, field))})  # __post_init__ freezes it
