"""The benchmark-adapter kit: checks that an adapter keeps the port's promises, for any test runner.

Give it a ``Benchmark`` and a task id; each check raises ``KitFailure`` (an ``AssertionError``)
naming what broke:

- ``check_fresh_instance``: two tasks of one id never share an environment's state, whether
  they run at the same time or one after the other on a pooled environment;
- ``check_determinism``: the same id played twice with the same calls (another task in
  between) gives the same first message, offered tools, results, events and verdict;
- ``check_gold_path``: the task's own solution (``gold_actions()`` for ``act`` games,
  ``gold_answer()`` for question answering) ends the episode and passes the verifier.

>>> import asyncio
>>> from hx.environments.gaia import GaiaBenchmark
>>> asyncio.run(check_adapter(GaiaBenchmark("tests/fixtures/gaia"), "gaia:all:dev:0"))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hx.environments.registry import Benchmark, TaskId
from hx.runtime.task import Task
from schemas.event import Event
from schemas.messages import ToolCall, ToolSchema
from schemas.tools import VerifierScore


class KitFailure(AssertionError):
    """An adapter broke one of the port's promises."""


@dataclass(frozen=True)
class Step:
    """One tool call and what came back."""

    call: ToolCall
    output: str
    is_error: bool
    data: dict[str, Any]


@dataclass(frozen=True)
class Episode:
    """Everything observable about one played episode."""

    first: str
    tools: tuple[ToolSchema, ...]
    steps: tuple[Step, ...]
    events: tuple[Event, ...]
    done: bool
    verdict: VerifierScore


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise KitFailure(message)


def gold_calls(task: Task) -> list[ToolCall]:
    """The task's own solution as tool calls (call after ``reset``)."""
    actions = getattr(task, "gold_actions", None)
    if callable(actions):
        return [ToolCall(id=f"gold{i}", name="act", input={"action": a}) for i, a in enumerate(actions())]
    answer = getattr(task, "gold_answer", None)
    if callable(answer):
        return [ToolCall(id="gold0", name="final_answer", input={"answer": answer()})]
    raise KitFailure(f"{task.spec.id}: the task offers neither gold_actions() nor gold_answer()")


async def play(task: Task, calls: Sequence[ToolCall] | None = None, final_answer: str = "") -> Episode:
    """Reset, make the calls (the gold ones when ``None``) until the episode ends, verify and close."""
    try:
        first = await task.reset()
        offered = tuple(t.schema for t in task.tools())
        events = list(task.drain_events())
        tools = {t.schema.name: t for t in task.tools()}
        steps: list[Step] = []
        for call in gold_calls(task) if calls is None else calls:
            if task.done:
                break
            tool = tools.get(call.name)
            if tool is None:
                raise KitFailure(f"{task.spec.id}: no tool {call.name!r}; tools: {sorted(tools)}")
            result = await tool.call(call)
            steps.append(Step(call=call, output=result.output, is_error=result.is_error, data=dict(result.data)))
            events.extend(task.drain_events())
        verdict = await task.verify(final_answer)
        return Episode(first=first, tools=offered, steps=tuple(steps), events=tuple(events), done=task.done,
                          verdict=verdict)
    finally:
        await task.close()


async def check_gold_path(bench: Benchmark, task_id: str) -> Episode:
    """The task's own solution ends the episode and the verifier passes it."""
    played = await play(bench.make_task(TaskId.parse(task_id)))
    _expect(played.done, f"{task_id}: the gold path ({len(played.steps)} calls) did not end the episode")
    _expect(played.verdict.passed, f"{task_id}: the gold path was not judged a success: {played.verdict}")
    return played


async def check_fresh_instance(bench: Benchmark, task_id: str) -> None:
    """Tasks of one id share no state: at the same time, or one after the other on a pooled environment."""
    tid = TaskId.parse(task_id)
    a, b = bench.make_task(tid), bench.make_task(tid)
    _expect(a is not b, f"{task_id}: make_task returned the same object twice")
    try:
        first_a = await a.reset()
        tools_a = tuple(t.schema for t in a.tools())
        calls = gold_calls(a)[:3]
        tool = {t.schema.name: t for t in a.tools()}
        for call in calls:  # move the first episode on before the second starts
            if not a.done:
                await tool[call.name].call(call)
        first_b = await b.reset()
        _expect(first_b == first_a, f"{task_id}: a second task running beside the first saw another first message")
        _expect(tuple(t.schema for t in b.tools()) == tools_a,
                f"{task_id}: a second task running beside the first was offered other tools")
    finally:
        await a.close()
        await b.close()
    later = await play(bench.make_task(tid), calls=())
    _expect(later.first == first_a, f"{task_id}: a task on a reused environment saw another first message")


def _differences(one: Episode, two: Episode) -> str:
    if one.first != two.first:
        return "first message"
    if one.tools != two.tools:
        return "offered tools"
    for i, (x, y) in enumerate(zip(one.steps, two.steps, strict=False)):
        if x != y:
            return f"result of call {i} ({x.call.input})"
    if len(one.steps) != len(two.steps):
        return "number of calls"
    for i, (e, f) in enumerate(zip(one.events, two.events, strict=False)):
        if e != f:
            return f"event {i} ({e.TYPE})"
    if len(one.events) != len(two.events):
        return "number of events"
    if one.verdict != two.verdict:
        return "verdict"
    return ""


async def check_determinism(bench: Benchmark, task_id: str, calls: Sequence[ToolCall] | None = None, *,
                            between: str | None = None) -> Episode:
    """The same id and calls give the same episode, even with another task (``between``) played in between."""
    tid = TaskId.parse(task_id)
    if calls is None:
        probe = bench.make_task(tid)
        try:
            await probe.reset()
            calls = gold_calls(probe)  # fixed once: some games' own solvers walk at random
        finally:
            await probe.close()
    one = await play(bench.make_task(tid), calls)
    if between is not None:
        await play(bench.make_task(TaskId.parse(between)), calls=())
    two = await play(bench.make_task(tid), calls)
    differs = _differences(one, two)
    _expect(not differs, f"{task_id}: two plays with the same calls differ in the {differs}")
    return one


async def check_adapter(bench: Benchmark, task_id: str, *, between: str | None = None) -> None:
    """All the checks on one task id."""
    await check_gold_path(bench, task_id)
    await check_fresh_instance(bench, task_id)
    await check_determinism(bench, task_id, between=between)
