"""D3 ``explore_untried``: offer the actions not yet tried in the current state, and find the way to new ones.

Failure addressed: wandering. An agent without a memory of what it did (a random one
above all) retries the same actions in the same places and leaves whole parts of the
world unexplored until the step budget runs out. This processor remembers, per state
(the set of actions valid now, see ``_choices``), the actions tried there and where
each led (the state at the following model call). Before each model call it offers
only the actions not yet tried in the current state. When every action offered has
been tried and ``frontier`` is on, it offers only the first action of a shortest path
(breadth-first over the transitions learnt in this attempt) to the nearest state that
still has untried actions; otherwise the offer passes unchanged.

Attach with ``attach(ExploreUntried.accepted_hooks(), ExploreUntried(frontier=True))``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import Processor
from hx.processors._choices import OfferState, choices, narrowed
from schemas.hooks import AfterTool, BeforeModel


class ExploreUntried(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Narrow to untried actions; with ``frontier``, head for the nearest state with untried actions."""

    name: ClassVar[str] = "explore_untried"
    _order: ClassVar[int] = 40  # the last narrowing: explore among what the others left
    dimension: ClassVar[str] = "D3"
    addresses: ClassVar[tuple[str, ...]] = ("loop", "stagnation", "no_progress")

    frontier: bool = False
    """When everything here was tried, take the first step towards the nearest state with untried actions."""

    def __post_init__(self) -> None:
        self._at = OfferState()
        self._actions: dict[str, frozenset[str]] = {}
        """Per state seen, every action it offered."""
        self._moves: dict[str, dict[str, str]] = {}
        """Per state, the state each action tried there led to (the latest seen)."""
        self._pending: list[tuple[str, str]] = []

    def untried(self, state: str) -> set[str]:
        """The actions ``state`` offered that were never tried there."""
        return set(self._actions.get(state, frozenset())) - self._at.tried_in(state)

    def way_out(self, state: str) -> str | None:
        """The first action of a shortest known path from ``state`` to another state with untried actions."""
        first: dict[str, str] = {}
        queue = deque([state])
        seen = {state}
        while queue:
            here = queue.popleft()
            for action, there in self._moves.get(here, {}).items():
                if there in seen:
                    continue
                seen.add(there)
                first[there] = first.get(here, action)
                if self.untried(there):
                    return first[there]
                queue.append(there)
        return None

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Record tried actions (after_tool); narrow to untried ones or towards them (before_model)."""
        if isinstance(event, AfterTool):
            action = self._at.took(event)
            if action is not None:
                self._pending.append((self._at.state, action))
            yield event
            return
        state = self._at.enter(event)
        if len(self._pending) == 1:  # after several actions in one step, which one led here is unknown
            origin, action = self._pending[0]
            self._moves.setdefault(origin, {})[action] = state
        self._pending = []
        if not state:
            yield event
            return
        self._actions[state] = self._at.actions
        tried = self._at.tried_in(state)
        if any(a not in tried for a in choices(event.tools)):
            yield narrowed(event, lambda a: a not in tried)
            return
        step = self.way_out(state) if self.frontier else None
        yield narrowed(event, lambda a: a == step) if step is not None else event
