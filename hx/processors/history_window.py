"""D2 ``history_window``: keep the conversation within a sliding window of recent messages.

Failure addressed: context overflow on long episodes (the request outgrows the model's
window, or the model loses the thread in a long history). At every step start the
history is cut to the system messages, the first user message (the task and first
observation) and the last ``keep_last`` messages. The cut never separates an assistant
message that called tools from the tool results answering it, so no tool result is
left orphaned (providers reject those); when even the newest exchange is longer than
``keep_last`` it is kept whole. An optional note tells the model that earlier
messages were dropped.
"""

from __future__ import annotations

import string
from collections.abc import AsyncIterator
from typing import ClassVar

import msgspec

from hx.harness.processor import NORMAL, Processor
from schemas.hooks import StepStart
from schemas.messages import Message


def _head_length(messages: tuple[Message, ...]) -> int:
    """How many leading messages are always kept: the system messages and the first user message."""
    for i, m in enumerate(messages):
        if m.role == "user":
            return i + 1
        if m.role != "system":
            return i
    return len(messages)


def _cut_points(rest: tuple[Message, ...]) -> list[bool]:
    """For each position ``i`` (0..len), whether the kept tail may start there without orphaning a tool result."""
    ok = [True] * (len(rest) + 1)
    owner: dict[str, int] = {}
    for i, m in enumerate(rest):
        if m.role == "assistant":
            for call in m.tool_calls:
                owner[call.id] = i
        elif m.role == "tool":
            ok[i] = False  # never start with a tool result
            start = owner.get(m.tool_call_id or "")
            if start is not None:
                for j in range(start + 1, i + 1):  # the call and its result stay on the same side
                    ok[j] = False
    return ok


def window(messages: tuple[Message, ...], keep_last: int) -> tuple[tuple[Message, ...], tuple[Message, ...], int]:
    """Split ``messages`` into (head, kept tail, number dropped); nothing is dropped when it fits."""
    h = _head_length(messages)
    head, rest = messages[:h], messages[h:]
    if len(rest) <= keep_last:
        return head, rest, 0
    ok = _cut_points(rest)
    target = len(rest) - keep_last
    # the earliest safe cut that keeps at most keep_last messages; else the latest safe cut keeping more
    cut = next((i for i in range(target, len(rest)) if ok[i]), None)
    if cut is None:
        cut = next((i for i in range(target - 1, -1, -1) if ok[i]), 0)
    return head, rest[cut:], cut


class HistoryWindow(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Trim the history to the head plus the last ``keep_last`` messages, keeping tool exchanges whole."""

    name: ClassVar[str] = "history_window"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D2"

    keep_last: int = 20
    """How many recent messages (after the head) to keep."""
    note: str = "[$dropped earlier messages were removed from this conversation to save context]"
    """User message inserted after the head when messages were dropped (``$dropped``); empty for none."""

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self._note = string.Template(self.note)

    async def process(self, event: StepStart) -> AsyncIterator[StepStart]:
        """Drop the messages that fall out of the window."""
        head, tail, dropped = window(event.messages, self.keep_last)
        if not dropped:
            yield event
            return
        note = self._note.safe_substitute(dropped=dropped).strip()
        middle = (Message(role="user", content=note),) if note else ()
        yield msgspec.structs.replace(event, messages=(*head, *middle, *tail))
