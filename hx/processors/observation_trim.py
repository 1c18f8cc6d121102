"""D2 ``observation_trim``: cut long tool outputs down to their head and tail.

Failure addressed: context blow-up from verbose observations (a page dump, a long
listing, a stack trace) that crowd out the task and the history, or overflow the
model's window after a few steps. An output longer than ``max_chars`` keeps its first
and last characters around a marker saying how much was cut; the result's ``data``
records ``trimmed_chars`` so the trace shows what the model did not see.
"""

from __future__ import annotations

import string
from collections.abc import AsyncIterator
from typing import ClassVar

import msgspec

from hx.harness.processor import NORMAL, Processor
from hx.processors._hookutil import selected
from schemas.hooks import AfterTool


class ObservationTrim(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Trim tool outputs longer than ``max_chars`` to head + marker + tail (at most ``max_chars`` in all)."""

    name: ClassVar[str] = "observation_trim"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D2"

    max_chars: int = 4000
    """Longest output passed on unchanged; a trimmed output is no longer than this either."""
    head_share: float = 0.7
    """Share of the kept characters taken from the start (the rest from the end)."""
    marker: str = "\n[... $omitted characters omitted ...]\n"
    """Put between head and tail; ``$omitted`` is the number of characters cut."""
    tools: tuple[str, ...] = ()
    """Tool name globs to trim; empty means every tool."""

    def __post_init__(self) -> None:
        if self.max_chars < 1:
            raise ValueError("max_chars must be >= 1")
        if not 0.0 <= self.head_share <= 1.0:
            raise ValueError("head_share must be within [0, 1]")
        self._marker = string.Template(self.marker)

    def trim(self, text: str) -> str:
        """``text`` cut to at most ``max_chars`` characters (unchanged if it fits)."""
        if len(text) <= self.max_chars:
            return text
        # the marker's length depends on the count it reports: settle the count in a few passes
        omitted = len(text) - self.max_chars
        for _ in range(4):
            marker = self._marker.safe_substitute(omitted=omitted)
            budget = self.max_chars - len(marker)
            if budget <= 0:
                return text[: self.max_chars]
            if len(text) - budget == omitted:
                break
            omitted = len(text) - budget
        head = int(budget * self.head_share)
        tail = budget - head
        return text[:head] + marker + (text[len(text) - tail:] if tail else "")

    async def process(self, event: AfterTool) -> AsyncIterator[AfterTool]:
        """Trim the result's output when it is too long."""
        result = event.result
        if not selected(event.call.name, self.tools):
            yield event
            return
        output = self.trim(result.output)
        if output == result.output:
            yield event
            return
        data = {**result.data, "trimmed_chars": len(result.output) - len(output)}
        yield msgspec.structs.replace(event, result=msgspec.structs.replace(result, output=output, data=data))
