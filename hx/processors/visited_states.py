"""D3 ``visited_states``: remember the states the agent has seen and warn when it comes back.

Failure addressed: wandering in loops. In text games and web tasks an agent often
walks back and forth between the same few states (rooms, pages), repeating actions it
already tried there, until the step budget runs out. This processor remembers every
observation it has seen (as a digest of the normalised text) and which actions were
taken from it; when the current observation is one seen before, the next model call
gets a note saying how often the agent has been here and what it already tried.

Attach to ``["after_tool", "before_model"]``: after_tool records (results pass
through unchanged), before_model adds the note. The first observation (the task's
first user message) counts as a visit too.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import NORMAL, Processor
from hx.processors._hookutil import NoteMode, add_user_note, compile_patterns, selected, state_key
from schemas.hooks import AfterTool, BeforeModel
from schemas.messages import ToolCall

DEFAULT_NOTE = ("Note: you are back in a state you have been in before (earlier visits: $visits). "
                "Actions already taken from here: $tried. Try something different.")


def action_text(call: ToolCall) -> str:
    """How an action reads in a note: a lone string argument as itself, anything else as ``name(json)``."""
    values = list(call.input.values())
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return f"{call.name}({json.dumps(call.input, sort_keys=True)})"


class VisitedStates(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Track observation digests at after_tool; at before_model, note a revisited state and the actions tried."""

    name: ClassVar[str] = "visited_states"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D3"
    addresses: ClassVar[tuple[str, ...]] = ("loop", "stagnation")

    min_visits: int = 2
    """Visits of the current state (this one included) from which the note is shown."""
    tools: tuple[str, ...] = ()
    """Tool name globs whose results are states; empty means every tool."""
    ignore: tuple[str, ...] = ()
    """Regular expressions removed from an observation before it is compared (move counters, clocks)."""
    case_sensitive: bool = False
    """Compare observations with their case as written."""
    note: str = DEFAULT_NOTE
    """The note; ``$visits`` is the number of earlier visits, ``$tried`` the actions taken from here."""
    max_tried: int = 8
    """Most actions listed in a note (the most recent ones)."""
    mode: NoteMode = "append"

    def __post_init__(self) -> None:
        if self.min_visits < 2:
            raise ValueError("min_visits must be >= 2 (a state is new on its first visit)")
        self._ignore = compile_patterns(self.ignore, "ignore")
        self._note = string.Template(self.note)
        self._visits: dict[str, int] = {}
        self._tried: dict[str, list[str]] = {}
        self._current: str | None = None

    def key(self, observation: str) -> str:
        """The identity of a state: a digest of the observation with ignored parts and spacing removed."""
        text = observation
        for pattern in self._ignore:
            text = pattern.sub("", text)
        text = re.sub(r"\s+", " ", text).strip()
        return state_key(text if self.case_sensitive else text.lower())

    def _enter(self, key: str) -> None:
        self._visits[key] = self._visits.get(key, 0) + 1
        self._current = key

    def visits(self, observation: str) -> int:
        """How many times an observation's state has been entered so far."""
        return self._visits.get(self.key(observation), 0)

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Record the state a tool result shows (after_tool); add a note on a revisit (before_model)."""
        if isinstance(event, AfterTool):
            if not event.result.is_error and selected(event.call.name, self.tools):
                if self._current is not None:
                    tried = self._tried.setdefault(self._current, [])
                    action = action_text(event.call)
                    if action in tried:
                        tried.remove(action)
                    tried.append(action)
                self._enter(self.key(event.result.output))
            yield event
            return
        if self._current is None:
            first = next((m for m in event.messages if m.role == "user"), None)
            if first is not None:
                self._enter(self.key(first.content))
        count = self._visits.get(self._current or "", 0)
        if self._current is None or count < self.min_visits:
            yield event
            return
        tried = self._tried.get(self._current, [])[-self.max_tried:]
        text = self._note.safe_substitute(visits=count - 1, tried="; ".join(tried) or "none recorded")
        yield add_user_note(event, text, self.mode)
