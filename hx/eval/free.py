"""Free tasks: a suite's instruction-and-tools tasks played as a benchmark of their own (``free``).

A suite's free tasks become one ``FreeBenchmark``: one game per free task, played as task id
``free:<suite task name>:dev:0``. Each offers the tools its ``ToolSpec``s describe, every call
returning the spec's fixed ``returns`` text, and ``final_answer``, which records the answer and
ends the episode. The verifier passes when the task names an ``answer`` and the attempt's answer
(the submitted one, else the text after ``FINAL ANSWER:`` in the last message) matches it by
GAIA's normalised exact match, or, with no ``answer``, when the attempt answered anything at all.
The family is ``qa``, so the question-answering starter harness applies.

>>> from schemas.suite import FreeTask, Suite, SuiteTask
>>> suite = Suite(name="s", tasks=(SuiteTask(name="capital", free=FreeTask(instruction="Capital of France?",
...                                                                          answer="Paris")),))
>>> bench = free_benchmark(suite)
>>> [str(t) for t in bench.task_ids("capital", "dev")]
['free:capital:dev:0']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from hx.environments.errors import BenchmarkError
from hx.environments.gaia import SYSTEM_PROMPT, FinalAnswerTool, extract_answer
from hx.environments.gaia_scorer import gaia_match
from hx.environments.registry import Benchmark, TaskId, register_benchmark
from hx.runtime.task import Task, Tool
from schemas.event import Event
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.suite import FREE_BENCHMARK, FreeTask, Suite
from schemas.tools import EnvObservation, VerifierScore

ANY_ANSWER = "(any non-empty answer)"
"""What a free task without an expected answer takes as its solution: any answer passes."""


class CannedTool(Tool):
    """A free task's tool: whatever the input, the call returns the spec's fixed text."""

    def __init__(self, schema: ToolSchema, returns: str) -> None:
        self.schema = schema
        self._returns = returns

    async def call(self, call: ToolCall) -> ToolResult:
        """The fixed text."""
        return ToolResult(call_id=call.id, name=call.name, output=self._returns)


class FreeAttempt(Task):
    """One episode of a free task: its canned tools, ``final_answer``, and the answer check."""

    def __init__(self, task_id: TaskId, free: FreeTask) -> None:
        self.free = free
        self.system_prompt = free.system_prompt or SYSTEM_PROMPT
        self.spec = TaskSpec(id=str(task_id), instruction=free.instruction, benchmark=FREE_BENCHMARK,
                             split=task_id.split, seed=task_id.seed, meta={"free_task": task_id.game})
        canned = [CannedTool(ToolSchema(name=t.name, description=t.description,
                                        input_schema=t.input_schema or {"type": "object", "properties": {}}),
                             t.returns) for t in free.tools]
        self._tools: tuple[Tool, ...] = (*canned, FinalAnswerTool(self))
        self._events: list[Event] = []
        self.answer: str | None = None
        """What the agent submitted through ``final_answer``."""

    def tools(self) -> Sequence[Tool]:
        """The task's canned tools and ``final_answer``."""
        return self._tools

    async def reset(self) -> str:
        """The instruction."""
        self._events.append(EnvObservation(step=0, observation=self.free.instruction))
        return self.free.instruction

    def submit(self, answer: str) -> None:
        """Record the answer; the episode is over."""
        self.answer = answer
        self._events.append(EnvObservation(step=1, observation=f"answer submitted: {answer}", done=True,
                                           info={"answer": answer}))

    @property
    def done(self) -> bool:
        """True once an answer was submitted."""
        return self.answer is not None

    def drain_events(self) -> list[Event]:
        """The instruction and the submission, as observations."""
        events, self._events = self._events, []
        return events

    def solution(self) -> tuple[str, ...]:
        """The expected answer, if the task names one."""
        return (self.free.answer,) if self.free.answer else ()

    def gold_answer(self) -> str:
        """An answer the verifier passes (for the adapter kit)."""
        return self.free.answer or ANY_ANSWER

    async def verify(self, final_answer: str) -> VerifierScore:
        """Normalised match against the expected answer, or, with none, any non-empty answer."""
        answer = self.answer if self.answer is not None else extract_answer(final_answer)
        if self.free.answer:
            passed = gaia_match(answer, self.free.answer)
            verifier = "free:exact_match"
        else:
            passed = bool(answer.strip())
            verifier = "free:answered"
        shown = answer if len(answer) <= 200 else answer[:200] + "..."
        return VerifierScore(verifier=verifier, passed=passed, score=float(passed), reward=float(passed),
                             detail=f"answer={shown!r}")


class FreeBenchmark(Benchmark):
    """A suite's free tasks, one game each, played as ``free:<name>:dev:0``."""

    name: ClassVar[str] = FREE_BENCHMARK
    family: ClassVar[str] = "qa"

    def __init__(self, tasks: dict[str, FreeTask]) -> None:
        self._tasks = dict(tasks)

    def games(self) -> tuple[str, ...]:
        """The free tasks' names, in suite order."""
        return tuple(self._tasks)

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """The one id of a free task: ``free:<name>:dev:0``."""
        self._free(game)
        if split != "dev":
            raise BenchmarkError(f"free task {game!r} has only the dev split, not {split!r}")
        return self.first_ids(game, split, 1, limit)

    def make_task(self, task_id: TaskId) -> FreeAttempt:
        """A fresh episode of the free task."""
        self.check_own(task_id)
        free = self._free(task_id.game)
        if (task_id.split, task_id.seed) != ("dev", 0):
            raise BenchmarkError(f"task {str(task_id)!r}: a free task is played only as "
                                 f"{FREE_BENCHMARK}:{task_id.game}:dev:0")
        return FreeAttempt(task_id, free)

    def _free(self, game: str) -> FreeTask:
        try:
            return self._tasks[game]
        except KeyError:
            known = ", ".join(self._tasks) or "none"
            raise BenchmarkError(f"no free task {game!r} in this suite; free tasks: {known}") from None


def free_benchmark(suite: Suite) -> FreeBenchmark:
    """The benchmark of the suite's free tasks."""
    return FreeBenchmark({task.name: task.free for task in suite.tasks if task.free is not None})


def register_free(suite: Suite) -> FreeBenchmark:
    """Build the suite's free benchmark and register it in this process under ``free``."""
    bench = free_benchmark(suite)
    register_benchmark(FREE_BENCHMARK, lambda: bench)
    return bench
