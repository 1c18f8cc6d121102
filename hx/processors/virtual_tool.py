"""Harness-answered tool calls: how a processor keeps the agent going for one more step.

The run loop ends an attempt when a model response has no tool calls, and at
after_model a processor may change only the response's content and tool calls; it may
not add a user message. So a processor that wants the model to reconsider a final
answer (a self-check, a judge's critique) adds a tool call to that response. The call
is answered by the processor itself, never executed:

- after_model: ``add`` appends the call and remembers the text that answers it;
- before_tool: ``withhold`` sets ``approved=False``, so no tool runs and nothing
  pretends on the log that one did;
- after_tool: ``answer`` replaces the blocked result with the remembered text.

All three changes are made by the processor, so the log attributes each to it
(``ProcessorTriggered``). The tool is not among those offered to the model unless the
processor offers it at task_start (``offer``; the task_start contract permits changing
the offered tools). OpenAI-style
APIs accept an unoffered call in the history; a provider that insists every call names
an offered tool needs the tool offered. Once offered, the model may also call the tool
itself; such calls are answered with ``default_answer``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.hooks import AfterModel, AfterTool, BeforeTool, TaskStart
from schemas.messages import ToolCall, ToolSchema


class VirtualCalls:
    """The calls of one harness-answered tool in an attempt, by call id."""

    def __init__(self, tool: str, *, schema: ToolSchema | None = None, default_answer: str = "") -> None:
        self.tool = tool
        self.schema = schema
        self.default_answer = default_answer
        self.offered = False
        self._answers: dict[str, str] = {}

    def offer(self, event: TaskStart) -> TaskStart:
        """``event`` with the tool's schema among the offered tools."""
        if self.schema is None or any(t.name == self.tool for t in event.tools):
            return event
        self.offered = True
        return msgspec.structs.replace(event, tools=(*event.tools, self.schema))

    def add(self, event: AfterModel, answer: str, arguments: dict[str, Any]) -> AfterModel:
        """``event`` with one more call of the virtual tool, to be answered with ``answer``."""
        call_id = f"hx-{self.tool}-{event.step}-{len(self._answers)}"
        self._answers[call_id] = answer
        call = ToolCall(id=call_id, name=self.tool, input=arguments)
        return msgspec.structs.replace(event, tool_calls=(*event.tool_calls, call))

    def _answer_for(self, call: ToolCall) -> str | None:
        text = self._answers.get(call.id)
        if text is None and self.offered and call.name == self.tool:
            return self.default_answer
        return text

    def withhold(self, event: BeforeTool) -> BeforeTool:
        """``event`` kept from execution when it is a call of this tool."""
        if self._answer_for(event.call) is None or not event.approved:
            return event
        return msgspec.structs.replace(event, approved=False)

    def answer(self, event: AfterTool) -> AfterTool:
        """``event`` with the tool's answer, when it is a call of this tool."""
        text = self._answer_for(event.call)
        if text is None:
            return event
        result = msgspec.structs.replace(event.result, output=text, is_error=False)
        return msgspec.structs.replace(event, result=result)
