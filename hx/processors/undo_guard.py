"""D7 ``undo_guard``: do not offer the action that undoes what the agent just achieved.

Failure addressed: undoing progress. An agent that opens a door and closes it again, or
takes an object and drops it, or walks north and straight back south, spends its
steps going round in circles; a random agent does so often, since the undoing action
is always among the valid ones. Two actions are *inverse* under a list of word pairs
when they have the same number of words and every position where they differ holds a
pair, in either order (``open door`` / ``close door``, ``go north`` / ``go south``).

- An action that was *effective* (its result was no error and matched no ``refusals``
  pattern, and its observation had not been seen before in the attempt) makes its
  inverses under ``toggles`` unavailable in the state it was taken in, for the rest of
  the attempt (do not close the door you opened).
- Right after any action, its inverse under ``toggles`` and ``reversals`` is unavailable
  at the next step only (do not walk straight back).

Before each model call the unavailable actions are narrowed away (never all of them).
Attach with ``attach(UndoGuard.accepted_hooks(), UndoGuard())``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import ClassVar

from hx.harness.processor import Processor
from hx.processors._choices import DEFAULT_REFUSALS, OfferState, choices, compile_refusals, narrowed, refused
from schemas.hooks import AfterTool, BeforeModel

Pairs = frozenset[frozenset[str]]


def word_pairs(pairs: Iterable[tuple[str, str]]) -> Pairs:
    """The pairs as unordered, lower-case word sets."""
    return frozenset(frozenset((a.lower(), b.lower())) for a, b in pairs)


def inverse(a: str, b: str, pairs: Pairs) -> bool:
    """True when ``a`` and ``b`` differ, have as many words, and differ only by words forming a pair."""
    x, y = a.lower().split(), b.lower().split()
    return len(x) == len(y) and x != y and all(p == q or frozenset((p, q)) in pairs for p, q in zip(x, y, strict=True))


class UndoGuard(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Narrow away the inverse of the last action, and the toggle-inverses of effective ones."""

    name: ClassVar[str] = "undo_guard"
    _order: ClassVar[int] = 20  # after action_pruner, before the processors that pick what to do
    dimension: ClassVar[str] = "D7"
    addresses: ClassVar[tuple[str, ...]] = ("loop", "no_progress")

    toggles: tuple[tuple[str, str], ...] = (("open", "close"), ("lock", "unlock"), ("on", "off"), ("take", "drop"))
    """Word pairs whose actions undo each other's effect on the world."""
    reversals: tuple[tuple[str, str], ...] = (("north", "south"), ("east", "west"), ("up", "down"),
                                              ("enter", "exit"))
    """Word pairs whose actions lead back where the other came from."""
    refusals: tuple[str, ...] = DEFAULT_REFUSALS
    """Case-insensitive regular expressions; an observation matching one means the action did nothing."""

    def __post_init__(self) -> None:
        self._toggles = word_pairs(self.toggles)
        self._both = self._toggles | word_pairs(self.reversals)
        self._refusals = compile_refusals(self.refusals)
        self._at = OfferState()
        self._seen: set[str] = set()
        self._effective: dict[str, list[str]] = {}
        self._last: str | None = None

    def _achieved(self, state: str, action: str) -> None:
        done = self._effective.setdefault(state, [])
        if action not in done:
            done.append(action)

    def excluded(self, state: str, offered: Iterable[str]) -> set[str]:
        """The actions among ``offered`` that would undo an effective action here, or the last action."""
        done = self._effective.get(state, [])
        return {b for b in offered
                if any(inverse(a, b, self._toggles) for a in done)
                or (self._last is not None and inverse(self._last, b, self._both))}

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Record effective actions (after_tool); narrow away their inverses (before_model)."""
        if isinstance(event, AfterTool):
            action = self._at.action(event)
            if action is not None:
                novel = event.result.output not in self._seen
                self._seen.add(event.result.output)
                if novel and not refused(event.result, self._refusals):
                    self._achieved(self._at.state, action)
                self._last = action
            yield event
            return
        excluded = self.excluded(self._at.enter(event), choices(event.tools))
        self._last = None
        yield narrowed(event, lambda a: a not in excluded) if excluded else event
