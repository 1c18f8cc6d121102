"""D4 ``tool_whitelist``: refuse calls to tools outside a whitelist.

Failure addressed: calls to tools the harness does not mean the agent to use (a hidden
or dangerous tool the model still names, a tool that derails the task). At
before_tool a call to a tool not matching ``allow`` (or matching ``deny``) loses its
approval (``mode="withdraw"``: the run loop returns a blocked error result) or is
dropped (``mode="intercept"``: the loop answers with its blocked message). Attached at
after_tool as well, the blocked result is rewritten to tell the model which tools it
may use, so it does not retry the same call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar, Literal

import msgspec

from hx.harness.processor import NORMAL, Processor
from hx.processors._hookutil import selected
from schemas.hooks import AfterTool, BeforeTool


class ToolWhitelist(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Withdraw approval for (or intercept) calls to tools not in ``allow`` or in ``deny``."""

    name: ClassVar[str] = "tool_whitelist"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D4"
    addresses: ClassVar[tuple[str, ...]] = ("invalid_action",)
    standalone: ClassVar[bool] = False  # its defaults need configuring first

    allow: tuple[str, ...] = ()
    """Globs of tool names that may run; empty allows every tool not denied."""
    deny: tuple[str, ...] = ()
    """Globs of tool names that never run."""
    mode: Literal["withdraw", "intercept"] = "withdraw"
    """Withdraw approval (the call gets an error result) or drop the call."""

    def __post_init__(self) -> None:
        self._blocked: set[str] = set()

    def allowed(self, name: str) -> bool:
        """Whether a call to this tool may run."""
        return selected(name, self.allow, self.deny)

    def explanation(self, name: str) -> str:
        """What the model is told about a refused call."""
        text = f"Tool {name!r} is not available in this harness; the call was not executed."
        if self.allow:
            text += f" Tools you may call: {', '.join(self.allow)}."
        return text

    async def process(self, event: BeforeTool | AfterTool) -> AsyncIterator[BeforeTool | AfterTool]:
        """Refuse a call at before_tool; explain the refusal at after_tool."""
        if isinstance(event, BeforeTool):
            if self.allowed(event.call.name) or not event.approved:
                yield event
            elif self.mode == "withdraw":
                self._blocked.add(event.call.id)
                yield msgspec.structs.replace(event, approved=False)
            return  # intercept: yield nothing
        if event.call.id in self._blocked and event.result.is_error:
            result = msgspec.structs.replace(event.result, output=self.explanation(event.call.name))
            yield msgspec.structs.replace(event, result=result)
            return
        yield event
