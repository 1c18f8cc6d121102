"""D7 ``risky_tool_approval``: a declarative approval policy for destructive tool calls.

Failure addressed: irreversible actions taken on the agent's own judgement (deleting a
tree, force-pushing, dropping a table, piping a download into a shell). Interactive
approval is impossible in unattended runs, so the decision is written down as policy:
a call is risky when its tool name matches ``risky_tools`` or any string in its input
matches a ``risky_patterns`` regular expression; a risky call is refused
(``approved=False``) unless its tool is in ``allow_tools`` or its input matches an
``allow`` expression (for example ``rm -rf ./build``). Refusals are told to the model
with the matching rule when the processor is also attached at after_tool. Because the
policy is parameters, it is part of the harness value: evolvable, diffable, audited.

Attach with ``attach(RiskyToolApproval.accepted_hooks(), RiskyToolApproval())``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

from hx.harness.processor import PRE, Processor
from hx.processors._hookutil import compile_patterns, matches_any
from hx.processors.refusal import Refusals
from schemas.hooks import AfterTool, BeforeTool

DEFAULT_RISKY_PATTERNS = (
    # rm with recursive and force flags in any spelling: -rf, -fr, -Rf, -r -f, --recursive --force
    r"\brm\s+(?=(?:-\S+\s+)*?(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive)(?:\s|$))"
    r"(?=(?:-\S+\s+)*?(?:-[a-zA-Z]*f[a-zA-Z]*|--force)(?:\s|$))",
    r"\brm\s+(?:-\w+\s+)*-\w*[rR]\w*\s+/(?:\s|$)",  # recursive delete of /
    r"\bmkfs(?:\.\w+)?\b",
    r"\bdd\b[^\n]*\bof=/dev/",
    r"\bgit\s+push\b[^\n]*(?:--force\b|\s-f\b)",
    r"\bgit\s+reset\s+--hard\b",
    r"\bgit\s+clean\s+-\w*f",
    r"(?i)\bdrop\s+(?:table|database|schema)\b",
    r"(?i)\btruncate\s+table\b",
    r"\bchmod\s+(?:-R\s+)?0?777\b",
    r"\b(?:curl|wget)\b[^\n|]*\|\s*(?:sudo\s+)?(?:ba|z|da)?sh\b",
    r"(?:^|[;&|]\s*|\bsudo\s+)(?:shutdown|reboot|poweroff)\b",  # as a command, not a word in prose
    r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:",  # fork bomb
)


def strings(value: Any) -> Iterator[str]:
    """Every string inside a JSON-like value (keys excluded)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings(v)


class RiskyToolApproval(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Refuse tool calls the policy marks risky, unless the allow-list matches."""

    name: ClassVar[str] = "risky_tool_approval"
    _order: ClassVar[int] = PRE
    dimension: ClassVar[str] = "D7"

    risky_tools: tuple[str, ...] = ()
    """Tool names (shell globs) whose every call is risky, e.g. ``delete_*``."""
    risky_patterns: tuple[str, ...] = DEFAULT_RISKY_PATTERNS
    """Regular expressions searched in every string of a call's input."""
    allow: tuple[str, ...] = ()
    """Regular expressions: a risky call whose input matches one is approved anyway."""
    allow_tools: tuple[str, ...] = ()
    """Tool names (shell globs) never refused."""

    def __post_init__(self) -> None:
        self._risky = compile_patterns(self.risky_patterns, "risky_patterns")
        self._allow = compile_patterns(self.allow, "allow")
        self._refusals = Refusals()

    def risk(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """Why a call is refused, or None when the policy approves it."""
        if matches_any(tool, self.allow_tools):
            return None
        texts = list(strings(arguments))
        if matches_any(tool, self.risky_tools):
            why = f"tool {tool!r} is marked risky"
        else:
            hit = next((p for p in self._risky for t in texts if p.search(t)), None)
            if hit is None:
                return None
            why = f"its input matches the risky pattern {hit.pattern!r}"
        if any(p.search(t) for p in self._allow for t in texts):
            return None
        return f"refused by the approval policy: {why}; this action needs a human's approval"

    async def process(self, event: BeforeTool | AfterTool) -> AsyncIterator[BeforeTool | AfterTool]:
        """Refuse risky calls before they run; explain the refusal after."""
        if isinstance(event, AfterTool):
            yield self._refusals.explain(event)
            return
        reason = self.risk(event.call.name, event.call.input) if event.approved else None
        yield event if reason is None else self._refusals.refuse(event, reason)
