"""The winning actions of a recorded attempt: the tool calls that moved it towards its success.

A passing attempt's trace holds, after every tool call (``ToolInvoked``), what the
environment reported (``EnvObservation``): its score and the state it is in. An action
is *winning* when it raised the score, or moved the attempt to a state on its way to the
end. "On its way" is the loop-erased walk: when the attempt comes back to a state it was in
before, the actions between (a detour, a random walk's wandering) are not on the path; and
(``corroborated``) a change of state counts only when another passing attempt of the task
made the same move, since one walk's own state changes (a door closed in passing) are not
what the task needs. An
action after which the state stayed the same (a no-op, a "you can't do that") is never
winning. Nothing here knows a game:

- the state is the environment's own fields in ``EnvObservation.info`` (a text game's room
  description and inventory), besides the adapter's bookkeeping (``action``, ``invalid``,
  ``moves``); an environment that reports none is in the state its valid actions describe
  (or, when it lists none either, its observation);
- the score and the success and failure flags are part of the state, so a step that scores
  is never erased as a detour.

>>> # step 2 goes on to s2 and step 3 back to s1 (a detour); step 4 leaves s1 as it was (a no-op)
>>> loop_erased("s0", [("s1", 1), ("s2", 2), ("s1", 3), ("s1", 4), ("s3", 5)])
[1, 5]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from schemas.envelope import Record
from schemas.messages import ToolCall
from schemas.tools import EnvObservation, ToolInvoked

BOOKKEEPING = frozenset({"action", "invalid", "moves", "task"})
"""``EnvObservation.info`` keys an adapter adds about the call itself, not about the world's state (``task``: the
instruction, on the opening observation only)."""


@dataclass(frozen=True)
class WinningStep:
    """A recorded tool call on the attempt's way to success."""

    step: int
    call: ToolCall
    """The call as the tool ran it (after the recorded harness's before_tool)."""
    why: str
    """``score 0 -> 1``, ``success`` or ``state changed``."""
    before: str = ""
    """The state it was taken in (``state_of``)."""
    after: str = ""
    """The state it led to."""

    @property
    def transition(self) -> tuple[str, str, str]:
        """(state before, action, state after): what another attempt must repeat to corroborate a change of state."""
        return self.before, self.action, self.after

    @property
    def goal(self) -> bool:
        """True when the action scored or succeeded (more than a change of state)."""
        return self.why != "state changed"

    @property
    def action(self) -> str:
        """The call as a reader names it: its lone string argument, else ``name(input)``."""
        values = list(self.call.input.values())
        if len(values) == 1 and isinstance(values[0], str):
            return values[0]
        return f"{self.call.name}({msgspec.json.encode(self.call.input).decode()})"


def state_of(observation: EnvObservation) -> str:
    """A digest of the state the environment reports (its own info fields, the score and the verdict flags)."""
    world = {k: v for k, v in observation.info.items() if k not in BOOKKEEPING}
    if not world:  # no state of its own reported: what it offers now is the state
        world = {"valid_actions": sorted(observation.valid_actions)} if observation.valid_actions else {
            "observation": observation.observation}
    key = msgspec.json.encode([observation.score, observation.success, observation.failure, world], order="sorted")
    return hashlib.sha256(key).hexdigest()[:16]


def loop_erased(start: str, moves: Sequence[tuple[str, int]]) -> list[int]:
    """The steps of the walk from ``start`` through ``moves`` (state reached, step) left once its loops are erased."""
    path: list[tuple[str, int]] = [(start, 0)]
    where = {start: 0}
    for state, step in moves:
        if state == path[-1][0]:
            continue  # the state stayed the same: a no-op
        if state in where:  # back where it was: the steps since are a detour
            del path[where[state] + 1:]
            where = {s: i for i, (s, _) in enumerate(path)}
            continue
        where[state] = len(path)
        path.append((state, step))
    return [step for _, step in path[1:]]


def winning_steps(records: Sequence[Record]) -> tuple[WinningStep, ...]:
    """The winning actions of one attempt, from its records in log order (none without observations)."""
    start: str | None = None
    score, success = 0.0, False
    pending: ToolInvoked | None = None
    moves: list[tuple[str, int]] = []
    calls: dict[int, tuple[ToolInvoked, str, str, str]] = {}
    current = ""
    for record in records:
        event = record.event
        if isinstance(event, ToolInvoked):
            pending = event
        elif isinstance(event, EnvObservation):
            state = state_of(event)
            if start is None:
                start = state
            if pending is not None:  # the observation the call left behind
                # only a rise is a goal: a penalty (cookingworld's score falls on a mistake) is a change of state
                why = (f"score {score:g} -> {event.score:g}" if event.score > score else
                       "success" if event.success and not success else "state changed")
                calls[len(moves)] = (pending, why, current or start, state)
                moves.append((state, len(moves)))
                pending = None
            score, success, current = event.score, event.success, state
    if start is None:
        return ()
    kept = set(loop_erased(start, moves))
    return tuple(WinningStep(step=invoked.step, call=invoked.call, why=why, before=before, after=after)
                 for i, (invoked, why, before, after) in calls.items() if i in kept)


def corroborated(attempts: Sequence[Sequence[WinningStep]]) -> list[tuple[WinningStep, ...]]:
    """Each passing attempt's winning actions that the evidence backs: every action that scored or succeeded, and a
    change of state only when another passing attempt of the same task made the same move (same state, action and
    result). One random walk's state changes (closing a door on the way) are its own; a move two independent
    attempts both needed is on the task's way. A task with one passing attempt keeps its goal actions only."""
    seen: dict[tuple[str, str, str], set[int]] = {}
    for i, steps in enumerate(attempts):
        for w in steps:
            seen.setdefault(w.transition, set()).add(i)
    return [tuple(w for w in steps if w.goal or len(seen[w.transition]) > 1) for steps in attempts]
