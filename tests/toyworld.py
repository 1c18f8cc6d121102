"""A small text world for evolution tests: rooms behind doors, and a decoy that punishes taking the task literally.

``toyworld:rooms``: rooms in a row behind closed doors, a coin in one of them; the valid
actions (the ``act`` enum) follow the room, and like a real text game they include
actions that do nothing ("The door is shut.", "It stands open.").
A random walk finds the coin sometimes; pruning refused actions, preferring untried ones
and taking what the task names finds it often.

``toyworld:bell``: reach the garden, and leave the bell alone: ringing it loses the
game. A harness that prefers actions naming the task's words rings it at once, so an edit
that helps ``rooms`` hurts ``bell`` (the case variant isolation is for).

Everything is plain Python and seeded by the task id: instant and deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from hx.environments.errors import BenchmarkError
from hx.environments.registry import Benchmark, TaskId, register_benchmark
from hx.runtime.task import Task, Tool
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.tools import EnvObservation, VerifierScore

ROOMS = ("hall", "study", "pantry", "attic", "cellar", "porch")
ITEMS = ("lamp", "book", "spoon", "rope")


class ToyWorldTask(Task):
    """One episode of a toy world game."""

    def __init__(self, tid: TaskId) -> None:
        rng = random.Random(f"{tid.game}:{tid.split}:{tid.seed}")
        self.game = tid.game
        self.length = 4 if tid.game == "rooms" else 2
        self.coin = rng.randrange(1, self.length)
        self.items = {i: rng.choice(ITEMS) for i in range(self.length)}
        self.open = [rng.random() < 0.5 for _ in range(self.length - 1)]
        self.pos = 0
        self.won = self.lost = False
        instruction = ("Search the rooms for the coin and take it." if tid.game == "rooms" else
                       f"Reach the {ROOMS[self.length - 1]}. Leave the bell alone.")
        self.spec = TaskSpec(id=str(tid), instruction=instruction, benchmark="toyworld", split=tid.split,
                             seed=tid.seed, meta={"game": tid.game})
        self._tool = ActTool(self)
        self._events: list[EnvObservation] = []
        self._step = 0

    def tools(self) -> Sequence[Tool]:
        """The ``act`` tool."""
        return [self._tool]

    @property
    def done(self) -> bool:
        """Won or lost."""
        return self.won or self.lost

    def valid(self) -> tuple[str, ...]:
        """The actions offered now (some of them refused when tried)."""
        acts = ["look around", "inventory", f"take {self.items[self.pos]}"]
        for direction, door in (("east", self.pos), ("west", self.pos - 1)):
            if 0 <= door < self.length - 1:
                acts += [f"move {direction}", f"open door to {direction}"]
                if self.game == "bell":
                    acts.append(f"close door to {direction}")
        if self.game == "rooms" and self.pos == self.coin:
            acts.append("take coin")
        if self.game == "bell" and self.pos == 0:
            acts.append("ring bell")
        return tuple(sorted(acts))

    def describe(self) -> str:
        """The room as the player sees it."""
        here = f"You are in the {ROOMS[self.pos]}. You see a {self.items[self.pos]}."
        if self.game == "rooms" and self.pos == self.coin:
            here += " There is a coin here."
        if self.game == "bell" and self.pos == 0:
            here += " A bell hangs by the door."
        return here

    def act(self, action: str) -> str:
        """Take one action."""
        self._step += 1
        offered = self.valid()  # before the action changes the room
        direction = action.rsplit(" ", 1)[-1]
        door = self.pos if direction == "east" else self.pos - 1
        if action in ("look around",):
            out = self.describe()
        elif action == "inventory":
            out = "You carry nothing of use."
        elif action.startswith("take ") and action != "take coin":
            out = f"You pick up the {direction}, look at it and put it back."
        elif action == "take coin" and self.pos == self.coin:
            self.won, out = True, "You take the coin. You win."
        elif action == "ring bell":
            self.lost, out = True, "The bell rings. The game is lost."
        elif action.startswith("open door"):
            out = "It stands open." if self.open[door] else f"You open the {direction} door."
            self.open[door] = True
        elif action.startswith("close door"):
            out = "It stays shut." if not self.open[door] else f"You close the {direction} door."
            self.open[door] = False
        elif action.startswith("move ") and 0 <= door < self.length - 1:
            if not self.open[door]:
                out = "The door is shut."
            else:
                self.pos += 1 if direction == "east" else -1
                out = self.describe()
                if self.game == "bell" and self.pos == self.length - 1:
                    self.won = True
                    out += " You reached it. You win."
        else:
            out = "Nothing happens."
        self._events.append(EnvObservation(step=self._step, observation=out, valid_actions=self.valid(),
                                           done=self.done, success=self.won, failure=self.lost,
                                           info={"action": action, "invalid": action not in offered}))
        return out

    async def reset(self) -> str:
        """The first room."""
        self._events.append(EnvObservation(step=0, observation=self.describe(), valid_actions=self.valid()))
        return f"{self.spec.instruction}\n\n{self.describe()}"

    def drain_events(self) -> list[EnvObservation]:  # type: ignore[override]
        """Observations since the last call."""
        out, self._events = self._events, []
        return out

    async def verify(self, final_answer: str) -> VerifierScore:
        """Won or not."""
        return VerifierScore(verifier="toyworld", passed=self.won, score=1.0 if self.won else 0.0)

    def solution(self) -> tuple[str, ...]:
        """A solution (for the leakage scan)."""
        steps = [a for i in range(self.coin if self.game == "rooms" else self.length - 1)
                 for a in ("open door to east", "move east")]
        return (*steps, "take coin") if self.game == "rooms" else tuple(steps)


class ActTool(Tool):
    """One action per call, from the actions valid now."""

    def __init__(self, task: ToyWorldTask) -> None:
        self.task = task

    @property
    def schema(self) -> ToolSchema:  # type: ignore[override]
        """The schema with the actions valid now."""
        return ToolSchema(name="act", description="Take one action.", input_schema={
            "type": "object", "properties": {"action": {"type": "string", "enum": list(self.task.valid())}},
            "required": ["action"]})

    async def call(self, call: ToolCall) -> ToolResult:
        """Act, and list what is valid next."""
        out = self.task.act(str(call.input.get("action", "")))
        return ToolResult(call_id=call.id, name=call.name,
                          output=f"{out}\nValid actions: {', '.join(self.task.valid())}")


class ToyWorld(Benchmark):
    """``toyworld``: the games ``rooms`` and ``bell``, 1,000 seeds per split."""

    name: ClassVar[str] = "toyworld"
    family: ClassVar[str] = "textworld"

    def games(self) -> tuple[str, ...]:
        """The two games."""
        return ("rooms", "bell")

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """The first ``limit`` seeds of a split."""
        if game not in self.games():
            raise BenchmarkError(f"toyworld has no game {game!r}")
        return self.first_ids(game, split, 1000, limit)

    def make_task(self, task_id: TaskId) -> Task:
        """A fresh episode."""
        self.check_own(task_id)
        return ToyWorldTask(task_id)


register_benchmark("toyworld", ToyWorld)
