"""D8 ``structlog_events``: one structured log line per hook, for following an attempt live.

Failure addressed: not seeing what a running agent does until the attempt is over and
its log is read back. Each hook event becomes a structlog line with the hook, the step
and a compact summary (message count and characters, tool name and call id, approval,
error flag, stop reason, verdict), so ``hx`` output, a terminal or a log shipper shows
progress as it happens. Contents are summarised by length, not printed (they can hold
secrets or be huge); ``include_text`` adds a clipped preview.

Attach at the hooks to follow, e.g. ``attach(StructlogEvents.accepted_hooks(), StructlogEvents())``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

import structlog

from hx.harness.processor import POST, Processor
from schemas.hooks import (
    HOOK_OF,
    AfterModel,
    AfterTool,
    AnyHook,
    BeforeModel,
    BeforeTool,
    StepEnd,
    StepStart,
    TaskStart,
)

Level = Literal["debug", "info", "warning", "error"]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def summary(event: AnyHook, preview: int = 0) -> dict[str, Any]:
    """The fields logged for one hook event (lengths, names, flags; text only when ``preview`` > 0)."""
    fields: dict[str, Any] = {}
    if isinstance(event, TaskStart):
        fields.update(task_id=event.task.id, tools=len(event.tools), system_prompt_chars=len(event.system_prompt))
    elif isinstance(event, StepStart | BeforeModel | StepEnd):
        fields.update(step=event.step, messages=len(event.messages),
                      chars=sum(len(m.content) for m in event.messages))
        if isinstance(event, StepEnd):
            fields["done"] = event.done
        if preview and event.messages:
            fields["last"] = _clip(event.messages[-1].content, preview)
    elif isinstance(event, AfterModel):
        fields.update(step=event.step, model=event.model, content_chars=len(event.content),
                      tool_calls=[c.name for c in event.tool_calls], stop_reason=event.stop_reason)
        if preview:
            fields["content"] = _clip(event.content, preview)
    elif isinstance(event, BeforeTool):
        fields.update(step=event.step, tool=event.call.name, call_id=event.call.id, approved=event.approved)
    elif isinstance(event, AfterTool):
        fields.update(step=event.step, tool=event.call.name, call_id=event.call.id, is_error=event.result.is_error,
                      output_chars=len(event.result.output))
        if preview:
            fields["output"] = _clip(event.result.output, preview)
    else:
        fields.update(task_id=event.task_id, passed=event.passed, score=event.score, steps=event.steps,
                      status=event.status)
    return fields


class StructlogEvents(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Log each hook event as a structured line; events pass unchanged."""

    name: ClassVar[str] = "structlog_events"
    _order: ClassVar[int] = POST  # log what the other processors leave
    dimension: ClassVar[str] = "D8"

    logger: str = "hx.hooks"
    """The structlog logger name."""
    level: Level = "info"
    include_text: bool = False
    """Add a clipped preview of message, answer and tool output text."""
    preview_chars: int = 200

    def __post_init__(self) -> None:
        self._log = structlog.get_logger(self.logger)
        self._level = logging.getLevelNamesMapping()[self.level.upper()]

    async def process(self, event: AnyHook) -> AsyncIterator[AnyHook]:
        """Log the event."""
        self._log.log(self._level, "hook", hook=HOOK_OF[type(event)],
                      **summary(event, self.preview_chars if self.include_text else 0))
        yield event
