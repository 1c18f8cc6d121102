"""D2 ``checklist_follower``: when the world shows a list of things to do or get, work through it.

Failure addressed: ignoring instructions found along the way. Text games and tools
often show the real to-do list only in an observation (a recipe, a note, a list of
ingredients or steps); the instruction itself says "follow the note". An agent that
does not track the list stops after one item or never starts. This processor remembers
the items of every list a tool result shows (at least ``min_items`` lines starting with
``-``, ``*``, ``•``, or ``1.`` / ``1)`` style numbers) as their content words. An item
is done once an action mentioning it (sharing a content word) was effective: its result
was no error and matched no ``refusals`` pattern. Before each model call the offer is
narrowed to the actions not yet tried in the current state that mention an item not
yet done; when there are none, it passes unchanged.

Attach with ``attach(ChecklistFollower.accepted_hooks(), ChecklistFollower())``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import Processor
from hx.processors._choices import (
    DEFAULT_REFUSALS,
    DEFAULT_STOPWORDS,
    OfferState,
    choices,
    compile_refusals,
    content_words,
    narrowed,
    refused,
)
from schemas.hooks import AfterTool, BeforeModel

_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(\S.*)$", re.MULTILINE)


def list_items(text: str, min_items: int) -> list[str]:
    """The items of the lists in ``text`` (empty when it has fewer than ``min_items`` item lines)."""
    items = [m.group(1).strip() for m in _ITEM.finditer(text)]
    return items if len(items) >= min_items else []


class ChecklistFollower(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Narrow to the untried actions that mention a listed item not yet done."""

    name: ClassVar[str] = "checklist_follower"
    _order: ClassVar[int] = 35  # after task_objects, before explore_untried
    dimension: ClassVar[str] = "D2"
    addresses: ClassVar[tuple[str, ...]] = ("partial_progress", "no_progress")

    min_items: int = 2
    """Fewest item lines that make a list."""
    refusals: tuple[str, ...] = DEFAULT_REFUSALS
    """Case-insensitive regular expressions; an observation matching one means the action did nothing."""
    stopwords: tuple[str, ...] = DEFAULT_STOPWORDS
    """Words that say nothing about an item (compared in lower case)."""
    min_length: int = 3
    """Shortest word that counts."""

    def __post_init__(self) -> None:
        if self.min_items < 1 or self.min_length < 1:
            raise ValueError("min_items and min_length must be >= 1")
        self._refusals = compile_refusals(self.refusals)
        self._stop = frozenset(w.lower() for w in self.stopwords)
        self._at = OfferState()
        self._items: dict[str, frozenset[str]] = {}
        self._done: set[str] = set()

    def words(self, text: str) -> frozenset[str]:
        """The content words of ``text``."""
        return content_words(text, self._stop, self.min_length)

    def pending(self) -> list[frozenset[str]]:
        """The content words of each remembered item not yet done."""
        return [words for item, words in self._items.items() if item not in self._done]

    def record(self, action: str | None, event: AfterTool) -> None:
        """Mark the items an effective action mentions as done; remember the items of any list shown."""
        if action is not None and not refused(event.result, self._refusals):
            said = self.words(action)
            self._done.update(item for item, words in self._items.items() if words & said)
        if not event.result.is_error:
            for item in list_items(event.result.output, self.min_items):
                words = self.words(item)
                if words:
                    self._items.setdefault(item.lower(), words)

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Collect lists and done items (after_tool); narrow to actions on pending items (before_model)."""
        if isinstance(event, AfterTool):
            self.record(self._at.took(event), event)
            yield event
            return
        state = self._at.enter(event)
        pending = self.pending()
        tried = self._at.tried_in(state)
        need = frozenset().union(*pending)  # an action is on a pending item when it shares a word with one
        keep = {a for a in choices(event.tools) if a not in tried and self.words(a) & need} if pending else set()
        yield narrowed(event, lambda a: a in keep) if keep else event
