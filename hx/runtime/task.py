"""The task port: what the run loop needs of a task and its tools.

A benchmark adapter implements ``Task`` for one episode: the tools the agent acts
through, the first observation, whether the episode is over, and the verifier. The
environment's own events (observations, score) are handed to the loop through
``drain_events`` so they go on the log in order with everything else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from schemas.event import Event
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.tools import VerifierScore


class Tool(ABC):
    """A tool the agent can call."""

    schema: ToolSchema
    nondeterministic: ClassVar[bool] = False
    """True when a replay must feed this tool's results from the log."""

    @abstractmethod
    async def call(self, call: ToolCall) -> ToolResult:
        """Execute one call; failures are results with ``is_error``, not exceptions."""


class Task(ABC):
    """One attempt's episode: tools, first observation, end condition and verifier."""

    spec: TaskSpec
    system_prompt: str = ""
    """The task family's default system prompt, before any processor edits it."""

    @abstractmethod
    def tools(self) -> Sequence[Tool]:
        """The tools offered to the agent."""

    @abstractmethod
    async def reset(self) -> str:
        """Start the episode and return the first user message."""

    @property
    def done(self) -> bool:
        """True once the episode is over (the agent may stop calling tools earlier)."""
        return False

    def drain_events(self) -> list[Event]:
        """Environment events produced since the last call, in order."""
        return []

    @abstractmethod
    async def verify(self, final_answer: str) -> VerifierScore:
        """Judge the attempt; ``final_answer`` is the model's last content."""

    def solution(self) -> tuple[str, ...]:
        """The reference solution after ``reset`` (gold actions, an expected answer), never shown to an agent.

        The evolution gate scans every candidate for it (answer leakage); () when unknown.
        """
        return ()

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the environment."""


class FunctionTool(Tool):
    """A tool backed by a plain function of its input (for simple tasks and tests)."""

    def __init__(self, schema: ToolSchema, fn: Callable[..., object]) -> None:
        self.schema = schema
        self._fn = fn

    async def call(self, call: ToolCall) -> ToolResult:
        """Run the function; an exception becomes an error result."""
        try:
            output = self._fn(**call.input)
        except Exception as exc:  # noqa: BLE001 - a tool's failure is a result the model sees
            return ToolResult(call_id=call.id, name=call.name, output=f"{type(exc).__name__}: {exc}", is_error=True)
        return ToolResult(call_id=call.id, name=call.name, output=str(output))
