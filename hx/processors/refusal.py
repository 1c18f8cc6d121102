"""Telling the model why the harness refused a tool call.

A before_tool processor refuses a call by setting ``approved=False``; the run loop then
returns the bare result ``"tool call blocked by the harness"``, which gives the model
nothing to correct. A processor attached at after_tool as well can use ``Refusals`` to
remember each refusal's reason and put it into that result (after_tool may change the
result's output), so the model learns what to do differently.
"""

from __future__ import annotations

import msgspec

from hx.runtime.loop import BLOCKED
from schemas.hooks import AfterTool, BeforeTool


class Refusals:
    """Reasons of the calls one processor refused during an attempt, by call id."""

    def __init__(self) -> None:
        self._reasons: dict[str, str] = {}

    def refuse(self, event: BeforeTool, reason: str) -> BeforeTool:
        """``event`` withdrawn from execution, remembering why."""
        self._reasons[event.call.id] = reason
        return msgspec.structs.replace(event, approved=False)

    def explain(self, event: AfterTool) -> AfterTool:
        """``event`` with the reason added, when it is the blocked result of a call refused here."""
        reason = self._reasons.get(event.call.id)
        if reason is None or not event.result.output.startswith(BLOCKED):
            return event
        result = msgspec.structs.replace(event.result, output=f"{BLOCKED}: {reason}", is_error=True)
        return msgspec.structs.replace(event, result=result)
