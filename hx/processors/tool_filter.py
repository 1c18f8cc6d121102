"""D4 ``tool_filter``: offer the model only the tools the task needs.

Failure addressed: distraction by irrelevant tools. A large tool set invites the model
to call tools that cannot help (a shell in a text game, a browser for a closed-book
question), wasting steps and sometimes breaking the episode; long tool lists also
crowd the context. At task_start the offered tools are narrowed to those matching
``allow`` (shell-style globs; empty allows all) and not matching ``deny``.

This only changes what the model is shown; pair it with ``tool_whitelist`` at
before_tool to also refuse calls to hidden tools.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import msgspec

from hx.harness.processor import NORMAL, Processor
from hx.processors._hookutil import selected
from schemas.hooks import TaskStart


class ToolFilter(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Keep the offered tools that match ``allow`` and do not match ``deny``."""

    name: ClassVar[str] = "tool_filter"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D4"
    addresses: ClassVar[tuple[str, ...]] = ("invalid_action",)
    standalone: ClassVar[bool] = False  # its defaults need configuring first

    allow: tuple[str, ...] = ()
    """Globs of tool names to offer; empty offers every tool not denied."""
    deny: tuple[str, ...] = ()
    """Globs of tool names never offered."""

    def offered(self, name: str) -> bool:
        """Whether a tool of this name stays on offer."""
        return selected(name, self.allow, self.deny)

    async def process(self, event: TaskStart) -> AsyncIterator[TaskStart]:
        """Drop the tools the filter does not offer."""
        kept = tuple(t for t in event.tools if self.offered(t.name))
        yield event if len(kept) == len(event.tools) else msgspec.structs.replace(event, tools=kept)
