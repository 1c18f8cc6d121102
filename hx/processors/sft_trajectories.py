"""D9 ``sft_trajectories``: export successful attempts as chat transcripts for fine-tuning.

Failure addressed: successes the model cannot learn from. Rejection-sampling fine-tuning
(keep the trajectories the verifier accepted, fine-tune on them) is the simplest way to
make a model internalise what a harness taught it, but it needs whole conversations in
the chat format trainers read. At task_end this processor appends the attempt's final
conversation, as the model saw it at the last step (after any history edits), to a
JSONL file as ``{"messages": [...], "tools": [...], "task_id", "score", "passed"}``:
the OpenAI-style fine-tuning layout most trainers accept. By default only passed
attempts are written.

Turn-level records with behaviour log-probabilities for RL come from the log instead
(``training_bridge.attempt_to_rl_records``).

Attach with ``attach(SftTrajectories.accepted_hooks(), SftTrajectories(path="data/sft.jsonl"))``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from hx.harness.processor import POST, Processor
from hx.processors._hookutil import append_lines
from schemas.hooks import StepEnd, TaskEnd, TaskStart
from schemas.lifecycle import SCORED_STATUSES
from schemas.messages import Message, ToolSchema

SftHook = TaskStart | StepEnd | TaskEnd


def chat_message(message: Message) -> dict[str, Any]:
    """One message in the OpenAI chat layout (tool calls with JSON-encoded arguments)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": msgspec.json.encode(c.input).decode()}}
                             for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def chat_tool(tool: ToolSchema) -> dict[str, Any]:
    """One tool in the OpenAI function layout."""
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}}


class SftTrajectories(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Append each qualifying attempt's final conversation to a JSONL file."""

    name: ClassVar[str] = "sft_trajectories"
    _order: ClassVar[int] = POST
    dimension: ClassVar[str] = "D9"

    path: str
    """The JSONL file transcripts are appended to (created with its directory)."""
    only_passed: bool = True
    min_score: float = 0.0
    """Also require at least this verifier score."""
    include_system: bool = True
    """Keep system messages in the transcript."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("sft_trajectories needs a path")
        self._tools: tuple[ToolSchema, ...] = ()
        self._messages: tuple[Message, ...] = ()
        self.written = False
        """Whether this attempt's transcript was written."""

    async def process(self, event: SftHook) -> AsyncIterator[SftHook]:
        """Keep the latest conversation; write it when a qualifying attempt ends."""
        if isinstance(event, TaskStart):
            self._tools = event.tools
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)  # an unwritable place fails before any spend
        elif isinstance(event, StepEnd):
            self._messages = event.messages
        elif self._qualifies(event):
            self._write(event)
        yield event

    def _qualifies(self, end: TaskEnd) -> bool:
        return (bool(self._messages) and end.status in SCORED_STATUSES
                and (end.passed or not self.only_passed) and end.score >= self.min_score)

    def _write(self, end: TaskEnd) -> None:
        messages = [chat_message(m) for m in self._messages if self.include_system or m.role != "system"]
        line = msgspec.json.encode({"messages": messages, "tools": [chat_tool(t) for t in self._tools],
                                    "task_id": end.task_id, "score": end.score, "passed": end.passed})
        append_lines(self.path, line + b"\n")
        self.written = True
