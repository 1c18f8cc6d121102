"""Tool execution, environment observations and verifier scores."""

from __future__ import annotations

from schemas.event import Event, JsonObject
from schemas.messages import ToolCall, ToolResult


class ToolInvoked(Event, frozen=True, kw_only=True):
    """A tool call about to be executed (after the before_tool pipeline)."""

    TYPE = "tool.invoked"
    STARTS = "tool"

    step: int
    call: ToolCall


class ToolReturned(Event, frozen=True, kw_only=True):
    """What the tool itself returned (before the after_tool pipeline)."""

    TYPE = "tool.returned"
    ENDS = "tool"

    step: int
    result: ToolResult
    nondeterministic: bool = False
    """True when a replay must feed this result from the log instead of re-running the tool."""


class EnvObservation(Event, frozen=True, kw_only=True):
    """The benchmark environment's state after an action."""

    TYPE = "env.observation"

    step: int
    observation: str
    valid_actions: tuple[str, ...] = ()
    score: float = 0.0
    done: bool = False
    success: bool = False
    failure: bool = False
    info: JsonObject = {}
    """What the environment reported besides the observation (the action, whether it was invalid, the game's own
    fields): each benchmark adapter has its own."""


class VerifierScore(Event, frozen=True, kw_only=True):
    """The task verifier's judgement of an attempt."""

    TYPE = "verifier.score"
    CHANNEL = "score"

    verifier: str
    passed: bool
    score: float = 0.0
    reward: float = 0.0
    detail: str = ""
