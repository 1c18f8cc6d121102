"""What an attempt has seen, as the rule language reads it: texts as word sets, actions taken, states visited.

``AttemptView`` is the interpreter's private per-attempt state (``rule_program`` builds one
per attempt); ``matches`` and ``holds`` evaluate a ``Pattern`` and a condition against it.
The induction (``hx.aegis.induction``) replays recorded attempts through the same view, so
a rule means on the ledger exactly what it does in the harness.

Words are lower-case runs of letters and digits. The *content* of an action is its words
after the pattern's leading words, without the function words in ``FUNCTION_WORDS``
(``press 45 levers on panel`` names ``45``, ``levers`` and ``panel`` after ``press``).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable

from schemas.rules import (
    AnyCondition,
    AnyText,
    Did,
    LastObservation,
    NotDid,
    Pattern,
    ReadText,
    Revisited,
    Says,
    ShownAfter,
    TaskText,
)

_WORD = re.compile(r"[a-z0-9]+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
FUNCTION_WORDS = frozenset(("a", "an", "the", "in", "on", "into", "onto", "to", "from", "with", "of", "at", "for",
                            "and", "or", "by", "up", "out", "off", "some", "its", "it"))
"""Words that name nothing: articles, prepositions and conjunctions of English action phrases."""


def words(text: str) -> tuple[str, ...]:
    """The lower-case words of ``text``, in order."""
    return _words(text) if len(text) <= _CACHED_LENGTH else tuple(_WORD.findall(text.lower()))


_CACHED_LENGTH = 200
"""Actions and pattern words are short and recur at every step: their words are cached; observations are not."""


@functools.lru_cache(maxsize=1 << 16)
def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


@functools.lru_cache(maxsize=1 << 16)
def content(action: str, starts: str = "") -> frozenset[str]:
    """The words ``action`` names after its leading ``starts`` words, function words left out."""
    tokens = words(action)
    lead = words(starts)
    rest = tokens[len(lead):] if tokens[:len(lead)] == lead else tokens
    return frozenset(w for w in rest if w not in FUNCTION_WORDS)


@functools.lru_cache(maxsize=1 << 16)
def number_in(action: str) -> float | None:
    """The least number an action names (``press 45 levers on panel``: 45), or None."""
    found = [float(n) for n in _NUMBER.findall(action)]
    return min(found) if found else None


class AttemptView:
    """One attempt's history as the rules see it: updated by the interpreter after each tool call."""

    def __init__(self, task: str = "") -> None:
        self.task = frozenset(words(task))
        self.read: set[str] = set(self.task)
        self.last: frozenset[str] = frozenset()
        self.taken: list[str] = []
        self.shown: list[tuple[str, frozenset[str]]] = []
        """(action, words of what it showed), in order."""
        self.visits: Counter[str] = Counter()
        self.state = ""
        self._shown_cache: dict[ShownAfter, tuple[int, set[str]]] = {}

    def opening(self, text: str) -> None:
        """The task's opening observation (before any action)."""
        seen = frozenset(words(text))
        self.last = seen
        self.read |= seen

    def took(self, action: str, observation: str) -> None:
        """An action was taken and showed ``observation``."""
        seen = frozenset(words(observation))
        self.taken.append(action)
        self.shown.append((action, seen))
        self.last = seen
        self.read |= seen

    def enter(self, state: str) -> None:
        """A step begins in ``state`` (count the visit)."""
        self.state = state
        self.visits[state] += 1

    def text(self, text: AnyText) -> frozenset[str] | set[str]:
        """The words of one kind of text seen so far."""
        if isinstance(text, TaskText):
            return self.task
        if isinstance(text, LastObservation):
            return self.last
        if isinstance(text, ReadText):
            return self.read
        assert isinstance(text, ShownAfter)
        cached = self._shown_cache.get(text)
        if cached is not None and cached[0] == len(self.shown):
            return cached[1]
        out: set[str] = set()
        for action, seen in self.shown:
            if matches(text.action, action, self):
                out |= seen
        self._shown_cache[text] = (len(self.shown), out)
        return out


def matches(pattern: Pattern, action: str, view: AttemptView) -> bool:
    """True when ``action`` is one of the pattern's actions, given what the attempt has seen."""
    tokens = words(action)
    lead = words(pattern.starts)
    if tokens[:len(lead)] != lead:
        return False
    if any(w not in tokens for w in pattern.mentions):
        return False
    if pattern.named_in is None and pattern.not_named_in is None:
        return True
    named = content(action, pattern.starts)
    if pattern.named_in is not None and not named <= view.text(pattern.named_in):
        return False
    return pattern.not_named_in is None or bool(named - view.text(pattern.not_named_in))


def holds(condition: AnyCondition, view: AttemptView) -> bool:
    """True when the condition holds now."""
    if isinstance(condition, Says):
        return set(condition.words) <= view.text(condition.text)
    if isinstance(condition, Did):
        recent = view.taken[-condition.within:] if condition.within else view.taken
        return any(matches(condition.action, a, view) for a in recent)
    if isinstance(condition, NotDid):
        return not any(matches(condition.action, a, view) for a in view.taken)
    assert isinstance(condition, Revisited)
    return view.visits[view.state] - 1 >= condition.times


def all_hold(conditions: Iterable[AnyCondition], view: AttemptView) -> bool:
    """True when every condition holds."""
    return all(holds(c, view) for c in conditions)
