"""D3 ``task_notes``: keep key facts from tool results and show them again once they scroll away.

Failure addressed: forgetting. Once a history window or a summary drops old
messages, facts the agent learned early (a door code, a file path, where the key lies)
are gone, and the agent searches again or gives up. This processor copies the lines of
tool results that match configurable patterns into per-attempt notes and, before each
model call, adds the notes that are no longer visible in the conversation as one
compact user message.

Attach to ``["after_tool", "before_model"]``: after_tool collects (results pass
through unchanged), before_model re-injects. It runs early (``PRE``) so it reads a
result before ``observation_trim`` cuts it, and then brings back the cut facts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import PRE, Processor
from hx.processors._hookutil import NoteMode, add_user_note, compile_patterns, selected
from schemas.hooks import AfterTool, BeforeModel

DEFAULT_PATTERNS = (
    r"(?i)\b(key|code|password|passcode|combination|hint|clue)\b",
    r"(?i)\byou (see|notice|find|found)\b",
)


class TaskNotes(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Collect matching result lines (after_tool) and show the hidden ones again (before_model)."""

    name: ClassVar[str] = "task_notes"
    _order: ClassVar[int] = PRE
    """Early, so it reads tool results before a trimming processor cuts them."""
    dimension: ClassVar[str] = "D3"
    addresses: ClassVar[tuple[str, ...]] = ("partial_progress",)

    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    """Regular expressions; a result line matching any of them becomes a note."""
    tools: tuple[str, ...] = ()
    """Tool name globs whose results are read; empty means every tool."""
    max_notes: int = 12
    """Most notes kept (the most recent ones)."""
    max_line_chars: int = 200
    """Longer lines are cut to this length."""
    only_hidden: bool = True
    """Show only notes that no longer appear in the messages the model is about to see."""
    header: str = "Notes from earlier in this task:"
    mode: NoteMode = "append"

    def __post_init__(self) -> None:
        if self.max_notes < 1 or self.max_line_chars < 1:
            raise ValueError("max_notes and max_line_chars must be >= 1")
        self._patterns = compile_patterns(self.patterns, "patterns")
        self._notes: list[str] = []

    @property
    def notes(self) -> tuple[str, ...]:
        """The notes collected so far, oldest first."""
        return tuple(self._notes)

    def collect(self, output: str) -> None:
        """Add the matching lines of one tool output."""
        for raw in output.splitlines():
            line = raw.strip()[: self.max_line_chars]
            if line and any(p.search(line) for p in self._patterns):
                if line in self._notes:
                    self._notes.remove(line)
                self._notes.append(line)
        del self._notes[: -self.max_notes]

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Collect at after_tool; re-inject at before_model."""
        if isinstance(event, AfterTool):
            if not event.result.is_error and selected(event.call.name, self.tools):
                self.collect(event.result.output)
            yield event
            return
        notes = self._notes
        if self.only_hidden:
            notes = [n for n in notes if not any(n in m.content for m in event.messages)]
        if not notes:
            yield event
            return
        yield add_user_note(event, "\n".join([self.header, *(f"- {n}" for n in notes)]), self.mode)
