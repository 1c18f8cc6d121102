"""Recorded attempts indexed so that a candidate rule is judged in time linear in the steps it concerns.

The interpreter (``hx.processors.rule_program``) walks one attempt forward with an
``AttemptView``; the induction must judge hundreds of candidate patterns over thousands of
recorded steps, so it precomputes, per attempt, when each word was first read, first shown
after each kind of action, and which actions were offered by leading word. ``Indexed.matches``
answers "does this pattern match this action at step t" with the interpreter's semantics
(``tests/test_induction.py`` checks the two agree on recorded attempts).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from hx.aegis.induction.traces import AttemptTrace
from hx.processors._rule_view import content, words
from schemas.rules import AnyText, Pattern, ReadText, ShownAfter, TaskText

NEVER = 1 << 30
"""A step index later than any: a word never seen."""


def head(action: str) -> str:
    """An action's leading word (its verb in an English command)."""
    tokens = words(action)
    return tokens[0] if tokens else ""


def text_key(text: AnyText) -> str:
    """A cheap key for a text kind (hashing the Struct at every step would cost more than the lookup saves)."""
    if isinstance(text, ShownAfter):
        return "after:" + msgspec.json.encode(text.action).decode()
    return type(text).__name__


@dataclass
class Indexed:
    """One recorded attempt, indexed by word and by leading word."""

    trace: AttemptTrace
    task_words: frozenset[str] = frozenset()
    tokens: list[tuple[str, ...]] = field(default_factory=list)
    """The words of each step's action."""
    last: list[frozenset[str]] = field(default_factory=list)
    """The words of the last observation before each step (the opening before the first)."""
    read_first: dict[str, int] = field(default_factory=dict)
    """Word -> the first step whose observation showed it (-1: the task or the opening)."""
    shown_first: dict[str, dict[str, int]] = field(default_factory=dict)
    """Leading words of an action -> word -> the first step where such an action showed it."""
    offered_by_head: list[dict[str, list[str]]] = field(default_factory=list)
    """Per step, the offered actions by leading word."""
    first_kind: dict[str, int] = field(default_factory=dict)
    """Leading word -> the first step an action with it was taken."""
    _reach: dict[tuple[str, str, str], int] = field(default_factory=dict)

    @classmethod
    def of(cls, trace: AttemptTrace) -> Indexed:
        """Index one attempt."""
        out = cls(trace, task_words=frozenset(words(trace.instruction)))
        for w in out.task_words | frozenset(words(trace.opening)):
            out.read_first[w] = -1
        last = frozenset(words(trace.opening))
        for t, step in enumerate(trace.steps):
            toks = words(step.action)
            out.tokens.append(toks)
            out.last.append(last)
            by_head: dict[str, list[str]] = defaultdict(list)
            for a in step.offered:
                by_head[head(a)].append(a)
            out.offered_by_head.append(by_head)
            seen = frozenset(words(step.observation))
            for w in seen:
                out.read_first.setdefault(w, t)
            lead = toks[0] if toks else ""
            out.first_kind.setdefault(lead, t)
            shown = out.shown_first.setdefault(lead, {})
            for w in seen:
                shown.setdefault(w, t)
            last = seen
        return out

    def matches(self, pattern: Pattern, action: str, t: int) -> bool:
        """True when ``action`` is one of the pattern's actions at step ``t`` (the interpreter's ``matches``)."""
        toks = words(action)
        lead = words(pattern.starts)
        if toks[:len(lead)] != lead or any(w not in toks for w in pattern.mentions):
            return False
        return self.qualifies(pattern, action, t)

    def qualifies(self, pattern: Pattern, action: str, t: int) -> bool:
        """The pattern's text conditions hold for ``action`` at step ``t`` (its words matched already)."""
        named, other = pattern.named_in, pattern.not_named_in
        if named is not None and not self.known(text_key(named), named, action, pattern.starts, t):
            return False
        return other is None or not self.known(text_key(other), other, action, pattern.starts, t)

    def known(self, key: str, text: AnyText, action: str, starts: str, t: int) -> bool:
        """Every word the action names after ``starts`` is in ``text`` (whose ``text_key`` is ``key``) as seen
        before step ``t``."""
        if key == "LastObservation":
            return all(w in self.last[t] for w in content(action, starts)) if t < len(self.last) else \
                not content(action, starts)
        reach = self._reach.get((key, action, starts))
        if reach is None:  # the step from which every named word is known: one number per (text, action)
            reach = self._reach[key, action, starts] = max((self._first(text, w) for w in content(action, starts)),
                                                          default=-1)
        return reach < t

    def _first(self, text: AnyText, w: str) -> int:
        """The step after which ``w`` is part of ``text`` (-1: from the start; ``NEVER``: not in the attempt)."""
        if isinstance(text, TaskText):
            return -1 if w in self.task_words else NEVER
        if isinstance(text, ReadText):
            return self.read_first.get(w, NEVER)
        assert isinstance(text, ShownAfter)
        lead = words(text.action.starts)
        simple = len(lead) == 1 and text.action == Pattern(starts=text.action.starts)
        if simple:
            return self.shown_first.get(lead[0], {}).get(w, NEVER)
        return next((i for i, st in enumerate(self.trace.steps)
                     if w in words(st.observation) and self.matches(text.action, st.action, i)), NEVER)

    def offered(self, pattern: Pattern, t: int) -> list[str]:
        """The actions offered before step ``t`` that the pattern could match (by leading word)."""
        lead = words(pattern.starts)
        by_head = self.offered_by_head[t]
        if not lead:
            return [a for group in by_head.values() for a in group]
        return by_head.get(lead[0], [])

    def first_taken_kind(self, kind: str) -> int:
        """The first step an action with leading word ``kind`` was taken (``NEVER``: none was)."""
        return self.first_kind.get(kind, NEVER)

    def offer_size(self, t: int) -> int:
        """How many actions were offered before step ``t``."""
        return len(self.trace.steps[t].offered)


StepRef = tuple[Indexed, int]
"""One recorded step: its attempt and its index there."""


class Corpus:
    """A round's indexed attempts, with the steps that took, and that offered, each kind of action."""

    def __init__(self, traces: Iterable[AttemptTrace]) -> None:
        self.attempts = [Indexed.of(t) for t in traces]
        self.taken: dict[str, list[StepRef]] = defaultdict(list)
        self.offering: dict[str, list[StepRef]] = defaultdict(list)
        for a in self.attempts:
            for t, toks in enumerate(a.tokens):
                self.taken[toks[0] if toks else ""].append((a, t))
                for kind in a.offered_by_head[t]:
                    self.offering[kind].append((a, t))

    def taking(self, pattern: Pattern) -> list[StepRef]:
        """The steps whose action has the pattern's leading word (every step for a pattern without one)."""
        lead = words(pattern.starts)[:1]
        if not lead:
            return [(a, t) for a in self.attempts for t in range(len(a.tokens))]
        return self.taken.get(lead[0], [])

    def offering_kind(self, pattern: Pattern) -> list[StepRef]:
        """The steps that offered an action with the pattern's leading word."""
        lead = words(pattern.starts)[:1]
        if not lead:
            return [(a, t) for a in self.attempts for t in range(len(a.tokens))]
        return self.offering.get(lead[0], [])
