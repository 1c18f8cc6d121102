"""A recorded attempt as the run loop needs it again: its environment, fed from the log.

``Recording.of`` reads one attempt's resolved records once. ``RecordedTask`` plays its
environment back without running it: the first observation, each tool's result in
order, the environment's own events after reset and after each action, when the episode
ended, and the verifier's score. ``FedTool`` wraps a real tool whose results are
nondeterministic (``Tool.nondeterministic``, logged as ``ToolReturned.nondeterministic``):
in a replay against the real environment it still runs, so the environment moves on, but
the loop gets the logged result.

What the log does not hold is derived from what it does: a tool's own schema at a step
(a text game's ``act`` lists the actions valid now) is the schema the step's
``before_model`` event offered, unless that is the schema task_start's processors made,
which the loop offers only while the tool's own schema is still the one it started with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from hx.runtime.task import Task, Tool
from schemas.envelope import Record
from schemas.event import Event
from schemas.hooks import BeforeModel, HookRecord, ProcessorTriggered, StepEnd, StepStart, TaskStart
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import ToolInvoked, ToolReturned, VerifierScore

LOOP_TYPES: tuple[type[Event], ...] = (AttemptStarted, AttemptFinished, HookRecord, ProcessorTriggered, ModelRequest,
                                       ModelResponse, ModelError, ToolInvoked, ToolReturned, VerifierScore)
"""Events the run loop itself emits; anything right after a reset or a tool's return is the environment's."""


class RecordedFailure(Exception):
    """Stands for the exception that ended the logged attempt (an environment crash), replayed as it was recorded."""


@dataclass(frozen=True)
class Action:
    """One logged tool execution and what the environment did after it."""

    step: int
    result: ToolResult
    nondeterministic: bool
    env_events: tuple[Event, ...]
    done_after: bool
    """Whether the episode was over after this action (the last action of a step that ended it)."""
    schemas_after: dict[str, ToolSchema] | None
    """The tools' own schemas at the next step (None: unchanged)."""


@dataclass(frozen=True)
class Recording:
    """What one logged attempt holds of its task and environment."""

    started: AttemptStarted
    spec: TaskSpec | None
    system_prompt: str
    first_observation: str
    reset_events: tuple[Event, ...]
    tools_at_start: tuple[ToolSchema, ...]
    actions: tuple[Action, ...]
    score: VerifierScore | None
    finished: AttemptFinished | None
    steps: int = 0
    failure: str = ""
    """Why the logged attempt ended in an infrastructure failure (``Type: message``), else empty."""

    def nondeterministic(self, until_step: int | None = None) -> dict[str, list[ToolResult]]:
        """Per tool name, the results of its nondeterministic calls (up to ``until_step``), in order."""
        out: dict[str, list[ToolResult]] = {}
        for action in self.actions:
            if action.nondeterministic and (until_step is None or action.step <= until_step):
                out.setdefault(action.result.name, []).append(action.result)
        return out

    @classmethod
    def of(cls, records: Sequence[Record]) -> Recording:
        """Read a logged attempt's resolved records (in log order; the first is its ``attempt.started``)."""
        events = [r.event for r in records]
        started = events[0]
        assert isinstance(started, AttemptStarted)
        hooks = [e for e in events if isinstance(e, HookRecord)]
        start = next((h.event for h in hooks if h.stage == "emitted" and isinstance(h.event, TaskStart)), None)
        processed = [h.event for h in hooks if h.stage == "returned" and isinstance(h.event, TaskStart)]
        edited = {s.name: s for s in processed[-1].tools} if processed else {}
        at_start = {s.name: s for s in start.tools} if start is not None else {}
        first_user = next((h.event.messages[-1].content for h in hooks if h.stage == "emitted"
                           and isinstance(h.event, StepStart) and h.event.messages), "")
        offered = {h.step: h.event.tools for h in hooks if h.stage == "emitted" and isinstance(h.event, BeforeModel)}
        ends = {h.step: h.event.done for h in hooks if h.stage == "emitted" and isinstance(h.event, StepEnd)}
        returns = [i for i, e in enumerate(events) if isinstance(e, ToolReturned) and not _unknown(e.result)]
        actions: list[Action] = []
        for n, i in enumerate(returns):
            ret = events[i]
            assert isinstance(ret, ToolReturned)
            last_of_step = n + 1 == len(returns) or _step(events[returns[n + 1]]) != ret.step
            schemas = None
            if last_of_step and ret.step + 1 in offered:
                schemas = {s.name: (s if s != edited.get(s.name) else at_start.get(s.name, s))
                           for s in offered[ret.step + 1]}
            actions.append(Action(ret.step, ret.result, ret.nondeterministic, _env_after(events, i),
                                  last_of_step and ends.get(ret.step, False), schemas))
        finished = next((e for e in events if isinstance(e, AttemptFinished)), None)
        failure = finished.reason if finished is not None and finished.status == "infra_failure" else ""
        return cls(started=started, spec=start.task if start is not None else None,
                   system_prompt=start.system_prompt if start is not None else "", first_observation=first_user,
                   reset_events=_env_after(events, 0), tools_at_start=tuple(at_start.values()),
                   actions=tuple(actions), score=next((e for e in events if isinstance(e, VerifierScore)), None),
                   finished=finished, steps=finished.steps if finished is not None else 0, failure=failure)

    def raise_failure(self) -> None:
        """Raise the logged attempt's infrastructure failure again, so the loop records the same reason."""
        kind, _, message = self.failure.partition(": ")
        if not message or not kind.isidentifier():
            raise RecordedFailure(self.failure)
        raise type(kind, (RecordedFailure,), {})(message)  # the loop records "<type name>: <message>"


def _unknown(result: ToolResult) -> bool:
    """A result the loop made itself for a call of a tool it does not have (no tool ran)."""
    return result.is_error and result.output.startswith(f"unknown tool {result.name!r}")


def _step(event: Event) -> int:
    return event.step if isinstance(event, ToolReturned) else -1


def _env_after(events: Sequence[Event], i: int) -> tuple[Event, ...]:
    """The environment's events right after position ``i`` (a reset's ``attempt.started`` or a tool's return)."""
    out: list[Event] = []
    for event in events[i + 1:]:
        if isinstance(event, LOOP_TYPES):
            break
        out.append(event)
    return tuple(out)


class RecordedTool(Tool):
    """A tool of a recorded task: its schema as the log shows it, its results fed in order."""

    def __init__(self, task: RecordedTask, schema: ToolSchema) -> None:
        self.task = task
        self.schema = schema

    async def call(self, call: ToolCall) -> ToolResult:
        """The next logged result (with the replayed call's id), or the logged failure once they run out."""
        return self.task.act(call)


class RecordedNondeterministicTool(RecordedTool):
    """A recorded tool whose logged results were nondeterministic (so its replayed ``tool.returned`` says so too)."""

    nondeterministic = True


class RecordedTask(Task):
    """The environment of a logged attempt, played back from the log; no game runs."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.spec = recording.spec or TaskSpec(id=recording.started.task_id, instruction="")
        self.system_prompt = recording.system_prompt
        fed = {a.result.name for a in recording.actions if a.nondeterministic}
        self._tools = {s.name: (RecordedNondeterministicTool if s.name in fed else RecordedTool)(self, s)
                       for s in recording.tools_at_start}
        self._next = 0
        self._done = False
        self._pending: list[Event] = []

    def tools(self) -> Sequence[Tool]:
        """The tools the logged task offered at its start."""
        return list(self._tools.values())

    async def reset(self) -> str:
        """The logged first observation (or the logged failure when the attempt never started)."""
        if self.recording.spec is None and self.recording.failure:
            self.recording.raise_failure()
        self._pending = list(self.recording.reset_events)
        return self.recording.first_observation

    @property
    def done(self) -> bool:
        """Whether the logged episode was over at this point."""
        return self._done

    def drain_events(self) -> list[Event]:
        """The logged environment events of the last reset or action."""
        out, self._pending = self._pending, []
        return out

    def act(self, call: ToolCall) -> ToolResult:
        """Feed the next logged action's result and advance the recorded environment."""
        actions = self.recording.actions
        if self._next >= len(actions):
            if self.recording.failure:
                self.recording.raise_failure()
            return ToolResult(call_id=call.id, name=call.name, is_error=True,
                              output="replay: the logged attempt has no further tool result")
        action = actions[self._next]
        self._next += 1
        self._pending = list(action.env_events)
        self._done = action.done_after
        if action.schemas_after is not None:
            for name, schema in action.schemas_after.items():
                if name in self._tools:
                    self._tools[name].schema = schema
        return msgspec.structs.replace(action.result, call_id=call.id)

    async def verify(self, final_answer: str) -> VerifierScore:
        """The logged verifier score."""
        return self.recording.score or VerifierScore(verifier="none", passed=False)


class FedTool(Tool):
    """A real tool whose nondeterministic results come from the log while the log has them."""

    nondeterministic = True

    def __init__(self, tool: Tool, results: list[ToolResult]) -> None:
        self.tool = tool
        self.results = list(results)

    @property
    def schema(self) -> ToolSchema:  # type: ignore[override]  # read-only here: the real tool's, as it moves
        """The real tool's schema, as it is now."""
        return self.tool.schema

    async def call(self, call: ToolCall) -> ToolResult:
        """Run the real tool (the environment moves on as it did), but answer with the next logged result.

        Once the log has no result left (a fork past its step), the real result stands.
        """
        result = await self.tool.call(call)
        if not self.results:
            return result
        return msgspec.structs.replace(self.results.pop(0), call_id=call.id)


class FedTask(Task):
    """A real task whose nondeterministic tools are fed from a recording."""

    def __init__(self, task: Task, results: dict[str, list[ToolResult]]) -> None:
        self.task = task
        self.results = results
        """Per tool name, the logged results of its nondeterministic calls, in order."""
        self.system_prompt = task.system_prompt

    @property
    def spec(self) -> TaskSpec:  # type: ignore[override]  # read-only here: the real task's, as it moves
        """The real task's spec, as it is now (a game fills in its instruction at reset)."""
        return self.task.spec

    def tools(self) -> Sequence[Tool]:
        """The real tools, the nondeterministic ones fed from the log."""
        return [FedTool(t, self.results.get(t.schema.name, [])) if t.nondeterministic else t
                for t in self.task.tools()]

    async def reset(self) -> str:
        """Reset the real environment."""
        return await self.task.reset()

    @property
    def done(self) -> bool:
        """The real environment's end."""
        return self.task.done

    def drain_events(self) -> list[Event]:
        """The real environment's events."""
        return self.task.drain_events()

    async def verify(self, final_answer: str) -> VerifierScore:
        """The real verifier."""
        return await self.task.verify(final_answer)

    def solution(self) -> tuple[str, ...]:
        """The real task's solution."""
        return self.task.solution()

    async def close(self) -> None:
        """Release the real environment."""
        await self.task.close()
