"""D4 ``action_pruner``: stop offering actions the game has already refused, or that showed nothing new.

Failure addressed: invalid and wasted actions. A text game's list of valid actions
holds many that do nothing in the current situation ("You can't go that way.",
"The door is locked.", the same description on every "look"), and an agent choosing
among them, the random one most of all, spends most of its steps on them. This
processor remembers, per state (the set of actions valid now, see ``_choices``):

- *refused* actions, whose result was an error or whose observation matched one of the
  ``refusals`` patterns; they are offered again once an action in that state shows an
  observation never seen before in the attempt that is no refusal (the world changed: a
  door opened, a light came on);
- *dull* actions (``prune_repeats``), which gave exactly the observation they gave the
  last time in the same state; they stay pruned for the attempt.

Before each model call the current state's refused and dull actions are narrowed away
(never all of them). Attach with ``attach(ActionPruner.accepted_hooks(), ActionPruner())``
(after_tool records, results pass unchanged; before_model narrows).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import Processor
from hx.processors._choices import DEFAULT_REFUSALS, OfferState, compile_refusals, narrowed, refused
from schemas.hooks import AfterTool, BeforeModel
from schemas.messages import ToolResult


class ActionPruner(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Narrow away the actions refused in this state (until the world changes) and the ones that repeat."""

    name: ClassVar[str] = "action_pruner"
    _order: ClassVar[int] = 10  # the first narrowing (after PRE, before NORMAL): the others choose among the rest
    dimension: ClassVar[str] = "D4"
    addresses: ClassVar[tuple[str, ...]] = ("invalid_action", "no_progress", "stagnation")

    refusals: tuple[str, ...] = DEFAULT_REFUSALS
    """Case-insensitive regular expressions; an observation matching one means the action was refused."""
    prune_repeats: bool = True
    """Also prune an action whose observation repeated what it showed before in the same state."""

    def __post_init__(self) -> None:
        self._refusals = compile_refusals(self.refusals)
        self._at = OfferState()
        self._seen: set[str] = set()
        self._refused: dict[str, set[str]] = {}
        self._dull: dict[str, set[str]] = {}
        self._last: dict[tuple[str, str], str] = {}

    def pruned(self, state: str) -> set[str]:
        """The actions pruned in ``state`` now."""
        return self._refused.get(state, set()) | self._dull.get(state, set())

    def record(self, state: str, action: str, result: ToolResult) -> None:
        """Learn from one action taken in ``state`` and what it showed."""
        observation = result.output
        novel = observation not in self._seen
        self._seen.add(observation)
        if refused(result, self._refusals):
            self._refused.setdefault(state, set()).add(action)
        else:
            if novel:
                self._refused.pop(state, None)
            if self.prune_repeats and self._last.get((state, action)) == observation:
                self._dull.setdefault(state, set()).add(action)
        self._last[(state, action)] = observation

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Record each action's outcome (after_tool); narrow the offer (before_model)."""
        if isinstance(event, AfterTool):
            action = self._at.action(event)
            if action is not None:
                self.record(self._at.state, action, event.result)
            yield event
            return
        pruned = self.pruned(self._at.enter(event))
        yield narrowed(event, lambda a: a not in pruned) if pruned else event
