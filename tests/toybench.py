"""A tiny benchmark of our own for rollout tests: corridor games, one that cannot build, one that crashes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

from hx.environments.errors import BenchmarkError
from hx.environments.registry import Benchmark, TaskId, register_benchmark
from hx.runtime.models import ModelConfig
from hx.runtime.task import Task, Tool
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.tools import VerifierScore

ACTIONS = ("look", "move east", "move west", "take coin")
ACT = ToolSchema(name="act", description="One action in the corridor.", input_schema={
    "type": "object", "properties": {"action": {"type": "string", "enum": list(ACTIONS)}}, "required": ["action"]})
RANDOM = ModelConfig(main="random:")


class Corridor(Task):
    """Rooms in a row, the coin in the last: walk east and take it. ``crashy`` breaks on the second action."""

    system_prompt = "Find the coin."

    def __init__(self, tid: TaskId, bench: ToyBench) -> None:
        self.spec = TaskSpec(id=str(tid), instruction="Take the coin.", benchmark=tid.benchmark, split=tid.split,
                             seed=tid.seed, meta={"game": tid.game})
        self.bench = bench
        self.length = 1 if tid.game == "easy" else 2 + tid.seed % 3
        self.crashy = tid.game == "crashy"
        self.pos = 0
        self.actions = 0
        self.won = False
        bench.built += 1

    def tools(self) -> Sequence[Tool]:
        return [CorridorTool(self)]

    async def reset(self) -> str:
        bench = self.bench
        bench.active += 1
        bench.max_active = max(bench.max_active, bench.active)
        if bench.gate:  # a barrier: no episode starts until `gate` of them are running at once
            if bench.active >= bench.gate:
                bench.opened.set()
            await bench.opened.wait()
        return f"You are in room 0 of {self.length}."

    @property
    def done(self) -> bool:
        return self.won

    def act(self, action: str) -> str:
        self.actions += 1
        if self.crashy and self.actions >= 2:
            raise RuntimeError("the environment process died")
        last = self.length - 1
        if action == "move east" and self.pos < last:
            self.pos += 1
        elif action == "move west" and self.pos > 0:
            self.pos -= 1
        elif action == "take coin" and self.pos == last:
            self.won = True
            return "You take the coin. You win."
        elif action != "look":
            return "You can't do that."
        return f"You are in room {self.pos}."

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="toy.coin", passed=self.won, score=1.0 if self.won else 0.0)

    async def close(self) -> None:
        self.bench.active -= 1


class CorridorTool(Tool):
    schema = ACT

    def __init__(self, task: Corridor) -> None:
        self.task = task

    async def call(self, call: ToolCall) -> ToolResult:
        return ToolResult(call_id=call.id, name=call.name, output=self.task.act(str(call.input["action"])))


class ToyBench(Benchmark):
    """``toy``: corridor games, ``broken`` (cannot build a task) and ``crashy`` (dies mid-episode)."""

    name: ClassVar[str] = "toy"
    family: ClassVar[str] = "textworld"

    def __init__(self, gate: int = 0) -> None:
        self.gate = gate
        self.opened = asyncio.Event()
        self.active = 0
        self.max_active = 0
        self.built = 0
        self.closed = False

    def games(self) -> tuple[str, ...]:
        return ("walk", "easy", "broken", "crashy")

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        if game not in self.games():
            raise BenchmarkError(f"toy has no game {game!r}")
        base = {"train": 0, "dev": 100, "test": 200}[split]
        return [TaskId("toy", game, split, base + i) for i in range(limit or 10)]

    def make_task(self, task_id: TaskId) -> Task:
        if task_id.game == "broken":
            raise RuntimeError("no JVM available")
        return Corridor(task_id, self)

    def close(self) -> None:
        self.closed = True


register_benchmark("toy", ToyBench)


def ids(game: str, n: int, split: str = "dev") -> list[str]:
    return [str(t) for t in ToyBench().task_ids(game, split, n)]
