"""D2 ``task_objects``: offer first the untried actions that name what the task is about.

Failure addressed: ignoring the task. Among dozens of valid actions only a few touch
the objects and places the instruction names; an agent that does not read the task
closely (a random agent cannot read it at all) spends its steps on the others, and
often never does the one thing asked. At task_start this processor takes the content
words of the task's instruction (lower-case words of at least ``min_length`` letters
that are not ``stopwords``; the stopwords include task phrasing such as "find", "take",
"put"). Before each model call, among the actions not yet tried in the current state,
those sharing the most content words with the instruction are offered alone, when
they share at least one; otherwise the offer passes unchanged.

Attach with ``attach(TaskObjects.accepted_hooks(), TaskObjects())``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import Processor
from hx.processors._choices import DEFAULT_STOPWORDS, OfferState, choices, content_words, narrowed
from schemas.hooks import AfterTool, BeforeModel, TaskStart


class TaskObjects(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Narrow to the untried actions that share the most content words with the task's instruction."""

    name: ClassVar[str] = "task_objects"
    _order: ClassVar[int] = 30  # after the pruning processors, before the exploring ones
    dimension: ClassVar[str] = "D2"
    addresses: ClassVar[tuple[str, ...]] = ("no_progress", "partial_progress")

    stopwords: tuple[str, ...] = DEFAULT_STOPWORDS
    """Words that say nothing about the task's objects (compared in lower case)."""
    min_length: int = 3
    """Shortest word that counts."""

    def __post_init__(self) -> None:
        if self.min_length < 1:
            raise ValueError("min_length must be >= 1")
        self._stop = frozenset(w.lower() for w in self.stopwords)
        self._words: frozenset[str] = frozenset()
        self._at = OfferState()

    def words(self, text: str) -> frozenset[str]:
        """The content words of ``text``."""
        return content_words(text, self._stop, self.min_length)

    def relevant(self, state: str, offered: tuple[str, ...]) -> set[str]:
        """The untried actions of ``offered`` sharing the most content words with the task (empty: none shares)."""
        tried = self._at.tried_in(state)
        scores = {a: len(self.words(a) & self._words) for a in offered if a not in tried}
        best = max(scores.values(), default=0)
        return {a for a, score in scores.items() if score == best} if best > 0 else set()

    async def process(self, event: TaskStart | AfterTool | BeforeModel) -> AsyncIterator[
            TaskStart | AfterTool | BeforeModel]:
        """Read the task (task_start); record tried actions (after_tool); narrow the offer (before_model)."""
        if isinstance(event, TaskStart):
            self._words = self.words(event.task.instruction)
        elif isinstance(event, AfterTool):
            self._at.took(event)
        else:
            keep = self.relevant(self._at.enter(event), choices(event.tools))
            if keep:
                yield narrowed(event, lambda a: a in keep)
                return
        yield event
