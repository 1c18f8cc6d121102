"""The run loop against a real nats-server: event sequence, processor outcomes, failures, determinism."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import (
    POST,
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    CallContext,
    Completion,
    FunctionTool,
    HarnessConfig,
    Interrupt,
    ModelConfig,
    Processor,
    Provider,
    ProviderError,
    StepStart,
    Task,
    Tool,
)
from hx.processors.history_window import HistoryWindow
from hx.runtime.errors import AttemptExists
from hx.runtime.loop import BLOCKED, RunLoop
from hx.runtime.providers import base as providers_base
from hx.runtime.tracer import LogWriter
from schemas.envelope import encode_body
from schemas.event import Event
from schemas.history import conversation, packed, resolve_async
from schemas.hooks import HOOK_EVENT_TYPES, HookRecord, ProcessorTriggered, StepEnd, TaskEnd, TaskStart
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EncodedEvent, EventLog
from streams.server import NatsProcess
from streams.topology import trace_subject

replace = msgspec.structs.replace
HOOK_OF = {cls: name for name, cls in HOOK_EVENT_TYPES.items()}
ADD = ToolSchema(name="add", description="add two integers", input_schema={
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})


class CalcTask(Task):
    """Add 2 and 3 with the ``add`` tool and answer 5; the environment reports each action."""

    system_prompt = "You are a calculator."

    def __init__(self, task_id: str = "calc:1", tools: Sequence[Tool] | None = None, done_after: int = 0) -> None:
        self.spec = TaskSpec(id=task_id, instruction="What is 2 + 3?", benchmark="calc", seed=7)
        self._tools: list[Tool] = list(tools) if tools is not None else [FunctionTool(ADD, self._add)]
        self._events: list[Event] = []
        self.calls = 0
        self.done_after = done_after
        self.closed = False

    def _add(self, a: int, b: int) -> int:
        self.calls += 1
        self._events.append(EnvObservation(step=self.calls, observation=f"added {a} and {b}", score=a + b))
        return a + b

    def tools(self) -> list[Tool]:
        return self._tools

    async def reset(self) -> str:
        self._events.append(EnvObservation(step=0, observation="ready"))
        return self.spec.instruction

    @property
    def done(self) -> bool:
        return bool(self.done_after) and self.calls >= self.done_after

    def drain_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    async def verify(self, final_answer: str) -> VerifierScore:
        ok = final_answer.strip() == "5"
        return VerifierScore(verifier="exact", passed=ok, score=float(ok), detail=f"answer {final_answer!r}")

    async def close(self) -> None:
        self.closed = True


def call(i: int, a: int = 2, b: int = 3) -> dict[str, Any]:
    return {"id": f"c{i}", "name": "add", "input": {"a": a, "b": b}}


TWO_STEPS: list[dict[str, Any]] = [{"content": "", "tool_calls": [call(1)], "stop_reason": "tool_use"},
             {"content": "5", "stop_reason": "end_turn"}]


def models(script: list[dict[str, Any]] = TWO_STEPS, **kwargs: Any) -> ModelConfig:
    return ModelConfig(main="script:calc", provider_options={"script:calc": {"completions": script}}, **kwargs)


async def trace(log: EventLog, run_id: str, task_id: str = "calc:1", attempt: int = 0) -> list[Event]:
    return [r.event async for r in resolve_async(log.read(subjects=[trace_subject(run_id, 0, task_id, attempt)]))]


def label(event: Event) -> str:
    if isinstance(event, HookRecord):
        return f"{event.stage}:{HOOK_OF[type(event.event)]}" + (f"[{event.index}]" if event.index else "")
    return event.TYPE


def hook_events(events: list[Event], hook: str, stage: str = "returned") -> list[Any]:
    return [e.event for e in events if isinstance(e, HookRecord) and e.stage == stage
            and HOOK_OF[type(e.event)] == hook]


def of_type(events: list[Event], cls: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


async def run(nats_url: str, harness: HarnessConfig, task: Task | None = None, *, run_id: str = "r1",
              model_config: ModelConfig | None = None, **kwargs: Any) -> tuple[Any, list[Event]]:
    task = task or CalcTask()
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = (model_config or models()).agentic(harness, log=conn.log)
        result = await agent.run(task, run_id=run_id, **kwargs)
        events = await trace(conn.log, run_id, task.spec.id, kwargs.get("attempt", 0))
    return result, events


# --- processors -------------------------------------------------------------------------------


class Splitter(Processor):
    """Splits each tool call into two, the second with doubled arguments."""

    async def process(self, event: BeforeTool) -> AsyncIterator[BeforeTool]:
        yield event
        doubled = {k: v * 2 for k, v in event.call.input.items()}
        yield replace(event, call=replace(event.call, input=doubled))


class Blocker(Processor):
    """Intercepts every tool call."""

    async def process(self, event: BeforeTool) -> AsyncIterator[BeforeTool]:
        return
        yield


class Denier(Processor):
    """Withdraws approval instead of intercepting."""

    async def process(self, event: BeforeTool) -> AsyncIterator[BeforeTool]:
        yield replace(event, approved=False)


class Swallow(Processor):
    """Intercepts the model's answer."""

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        return
        yield


class StopAt(Processor):
    """Interrupts the attempt when step ``at`` starts."""

    at: int = 1
    infra: bool = False

    async def process(self, event: StepStart) -> AsyncIterator[StepStart]:
        if event.step == self.at:
            raise Interrupt(f"stopped at step {event.step}", status="infra_failure" if self.infra else "interrupted")
        yield event


class Broken(Processor):
    """A processor with a bug."""

    async def process(self, event: AfterTool) -> AsyncIterator[AfterTool]:
        raise ValueError("bad state")
        yield event


class Annotate(Processor):
    """Appends a note to tool results (runs last)."""

    _order = POST
    note: str = " (checked)"

    async def process(self, event: AfterTool) -> AsyncIterator[AfterTool]:
        yield replace(event, result=replace(event.result, output=event.result.output + self.note))


class Remind(Processor):
    """Appends a user reminder before every model call after the first."""

    async def process(self, event: BeforeModel) -> AsyncIterator[BeforeModel]:
        if event.step == 1:
            yield event
        else:
            yield replace(event, messages=(*event.messages, Message(role="user", content=f"step {event.step}")))


# --- the sequence of a normal attempt ---------------------------------------------------------

STEP_WITH_TOOL = ["emitted:step_start", "returned:step_start", "emitted:before_model", "returned:before_model",
                  "model.request", "model.response", "emitted:after_model", "returned:after_model",
                  "emitted:before_tool", "returned:before_tool", "tool.invoked", "tool.returned",
                  "env.observation", "emitted:after_tool", "returned:after_tool", "emitted:step_end",
                  "returned:step_end"]
STEP_ANSWER = ["emitted:step_start", "returned:step_start", "emitted:before_model", "returned:before_model",
               "model.request", "model.response", "emitted:after_model", "returned:after_model",
               "emitted:step_end", "returned:step_end"]


async def test_two_step_attempt_emits_every_event_in_order(nats_url: str) -> None:
    harness = HarnessConfig()
    task = CalcTask()
    result, events = await run(nats_url, harness, task, max_steps=2, seed=11)
    assert (result.status, result.passed, result.score, result.steps, result.reason) == ("completed", True, 1.0, 2, "")
    assert result.final_answer == "5" and result.events == len(events) and task.closed
    assert [label(e) for e in events] == [
        "attempt.started", "env.observation", "emitted:task_start", "returned:task_start",
        *STEP_WITH_TOOL, *STEP_ANSWER,
        "verifier.score", "emitted:task_end", "returned:task_end", "attempt.finished"]

    started, finished = events[0], events[-1]
    assert started == AttemptStarted(run_id="r1", round=0, task_id="calc:1", attempt=0,
                                     harness_digest=harness.digest, model="script:calc", seed=11)
    assert finished == AttemptFinished(run_id="r1", round=0, task_id="calc:1", attempt=0, passed=True, score=1.0,
                                       steps=2, status="completed")
    (task_start,) = hook_events(events, "task_start")
    assert task_start == TaskStart(task=task.spec, system_prompt="You are a calculator.", tools=(ADD,))
    steps = [e.step for e in events if isinstance(e, HookRecord)]
    assert steps == [0, 0] + [1] * 12 + [2] * 8 + [0, 0]

    requests, responses = of_type(events, ModelRequest), of_type(events, ModelResponse)
    system = Message(role="system", content="You are a calculator.")
    user = Message(role="user", content="What is 2 + 3?")
    first_call = ToolCall(id="c1", name="add", input={"a": 2, "b": 3})
    assistant = Message(role="assistant", tool_calls=(first_call,))
    tool_msg = Message(role="tool", content="5", tool_call_id="c1", name="add")
    assert [(r.role, r.model, r.step, r.try_index) for r in requests] == [("main", "script:calc", 1, 0),
                                                                         ("main", "script:calc", 2, 0)]
    assert requests[0].messages == (system, user) and requests[0].tools == (ADD,)
    assert requests[1].messages == (system, user, assistant, tool_msg)
    assert [(r.content, r.tool_calls, r.model_version) for r in responses] == [
        ("", (first_call,), "script:calc"), ("5", (), "script:calc")]
    assert of_type(events, ToolInvoked) == [ToolInvoked(step=1, call=first_call)]
    assert of_type(events, ToolReturned) == [ToolReturned(step=1, result=ToolResult(call_id="c1", name="add",
                                                                                    output="5"))]
    assert [o.observation for o in of_type(events, EnvObservation)] == ["ready", "added 2 and 3"]
    assert hook_events(events, "step_end") == [
        StepEnd(step=1, messages=(system, user, assistant, tool_msg), done=False),
        StepEnd(step=2, messages=(system, user, assistant, tool_msg, Message(role="assistant", content="5")),
                done=True)]
    assert of_type(events, VerifierScore) == [VerifierScore(verifier="exact", passed=True, score=1.0,
                                                            detail="answer '5'")]
    assert hook_events(events, "task_end") == [TaskEnd(task_id="calc:1", passed=True, score=1.0, steps=2)]
    # with no processors, each hook returns what it was given and nothing triggers
    assert of_type(events, ProcessorTriggered) == []
    emitted = [e.event for e in events if isinstance(e, HookRecord) and e.stage == "emitted"]
    assert emitted == [e.event for e in events if isinstance(e, HookRecord) and e.stage == "returned"]


async def test_records_show_each_hook_as_emitted_and_as_returned(nats_url: str) -> None:
    harness = HarnessConfig().attach("after_tool", Annotate()).attach("before_model", Remind())
    result, events = await run(nats_url, harness)
    assert result.status == "completed"
    (emitted,) = hook_events(events, "after_tool", "emitted")
    (returned,) = hook_events(events, "after_tool", "returned")
    assert (emitted.result.output, returned.result.output) == ("5", "5 (checked)")
    assert of_type(events, ToolReturned)[0].result.output == "5"  # what the tool itself returned
    # the model saw the annotated result and the reminder; the reminder is not kept in the history
    request = of_type(events, ModelRequest)[1]
    assert [m.content for m in request.messages[-2:]] == ["5 (checked)", "step 2"]
    assert hook_events(events, "step_end")[-1].messages[-2].content == "5 (checked)"
    assert all(m.content != "step 2" for m in hook_events(events, "step_end")[-1].messages)
    triggers = of_type(events, ProcessorTriggered)
    assert [(t.processor, t.hook, t.step, t.action, t.fields) for t in triggers] == [
        (Annotate.type_name(), "after_tool", 1, "changed", ("result.output",)),
        (Remind.type_name(), "before_model", 2, "changed", ("messages",))]


# --- split, intercept, interrupt ----------------------------------------------------------------


async def test_split_at_before_tool_executes_both_calls(nats_url: str) -> None:
    task = CalcTask()
    result, events = await run(nats_url, HarnessConfig().attach("before_tool", Splitter()), task)
    assert result.status == "completed" and task.calls == 2
    assert [i.call.input for i in of_type(events, ToolInvoked)] == [{"a": 2, "b": 3}, {"a": 4, "b": 6}]
    assert [r.result.output for r in of_type(events, ToolReturned)] == ["5", "10"]
    returned = [(e.index, e.event.call.input) for e in events if isinstance(e, HookRecord)
                and e.stage == "returned" and isinstance(e.event, BeforeTool)]
    assert returned == [(0, {"a": 2, "b": 3}), (1, {"a": 4, "b": 6})]
    (trigger,) = of_type(events, ProcessorTriggered)
    assert (trigger.action, trigger.outputs, trigger.hook, trigger.fields) == ("split", 2, "before_tool",
                                                                              ("call.input",))
    history = of_type(events, ModelRequest)[1].messages
    assert [(m.role, m.content, m.tool_call_id) for m in history[-2:]] == [("tool", "5", "c1"), ("tool", "10", "c1")]
    # each split event went through the hooks downstream of it
    assert [e.call.input for e in hook_events(events, "after_tool", "emitted")] == [{"a": 2, "b": 3},
                                                                                   {"a": 4, "b": 6}]


async def test_intercept_at_before_tool_blocks_the_tool(nats_url: str) -> None:
    task = CalcTask()
    result, events = await run(nats_url, HarnessConfig().attach("before_tool", Blocker()), task)
    assert result.status == "completed" and task.calls == 0
    assert of_type(events, ToolInvoked) == [] and of_type(events, ToolReturned) == []
    assert hook_events(events, "before_tool", "emitted") and not hook_events(events, "before_tool", "returned")
    assert hook_events(events, "after_tool", "emitted") == []
    (trigger,) = of_type(events, ProcessorTriggered)
    assert (trigger.processor, trigger.action, trigger.outputs, trigger.step) == (Blocker.type_name(),
                                                                                  "intercepted", 0, 1)
    last = of_type(events, ModelRequest)[1].messages[-1]
    assert (last.role, last.content, last.tool_call_id, last.name) == ("tool", BLOCKED, "c1", "add")


async def test_withdrawn_approval_blocks_the_tool_but_runs_after_tool(nats_url: str) -> None:
    task = CalcTask()
    result, events = await run(nats_url, HarnessConfig().attach("before_tool", Denier()), task)
    assert result.status == "completed" and task.calls == 0 and of_type(events, ToolInvoked) == []
    (after,) = hook_events(events, "after_tool", "emitted")
    assert after.result == ToolResult(call_id="c1", name="add", output=BLOCKED, is_error=True)
    (trigger,) = of_type(events, ProcessorTriggered)
    assert (trigger.action, trigger.fields) == ("changed", ("approved",))


async def test_intercept_at_after_model_drops_the_answer(nats_url: str) -> None:
    task = CalcTask()
    result, events = await run(nats_url, HarnessConfig().attach("after_model", Swallow()), task, max_steps=5)
    assert (result.status, result.steps, result.final_answer, result.passed) == ("completed", 1, "", False)
    assert task.calls == 0 and of_type(events, ToolInvoked) == []
    assert len(of_type(events, ModelResponse)) == 1 and not hook_events(events, "after_model", "returned")
    (step_end,) = hook_events(events, "step_end")
    assert [m.role for m in step_end.messages] == ["system", "user"] and step_end.done
    assert of_type(events, ProcessorTriggered)[0].action == "intercepted"


@pytest.mark.parametrize(("infra", "status"), [(False, "interrupted"), (True, "infra_failure")])
async def test_interrupt_at_step_start_ends_the_attempt(nats_url: str, infra: bool, status: str) -> None:
    task = CalcTask()
    result, events = await run(nats_url, HarnessConfig().attach("step_start", StopAt(at=2, infra=infra)), task)
    assert (result.status, result.reason, result.passed, result.steps) == (status, "stopped at step 2", False, 2)
    assert task.closed and task.calls == 1
    finished = events[-1]
    assert isinstance(finished, AttemptFinished)
    assert (finished.status, finished.reason, finished.passed, finished.steps) == (status, "stopped at step 2",
                                                                                  False, 2)
    (trigger,) = of_type(events, ProcessorTriggered)
    assert (trigger.processor, trigger.hook, trigger.step, trigger.action, trigger.reason) == (
        StopAt.type_name(), "step_start", 2, "interrupted", "stopped at step 2")
    assert len(of_type(events, ModelRequest)) == 1 and of_type(events, VerifierScore) == []
    (end,) = hook_events(events, "task_end", "emitted")
    assert (end.status, end.passed) == (status, False)
    assert [label(e) for e in events[-4:]] == ["processor.triggered", "emitted:task_end", "returned:task_end",
                                               "attempt.finished"]


async def test_a_processor_raising_ends_the_attempt_naming_it(nats_url: str) -> None:
    result, events = await run(nats_url, HarnessConfig().attach("after_tool", Broken()))
    assert result.status == "interrupted"
    assert Broken.type_name() in result.reason and "ValueError: bad state" in result.reason
    assert isinstance(events[-1], AttemptFinished) and events[-1].reason == result.reason
    (trigger,) = of_type(events, ProcessorTriggered)
    assert (trigger.processor, trigger.action, trigger.reason) == (Broken.type_name(), "interrupted", result.reason)


# --- budget and end conditions --------------------------------------------------------------------


async def test_step_budget(nats_url: str) -> None:
    forever = [{"tool_calls": [call(i)]} for i in range(10)]
    task = CalcTask()
    result, events = await run(nats_url, HarnessConfig(), task, model_config=models(forever), max_steps=3)
    assert (result.status, result.steps, result.reason) == ("budget_exhausted", 3, "step budget of 3 reached")
    assert task.calls == 3 and len(of_type(events, ModelRequest)) == 3
    assert isinstance(events[-1], AttemptFinished) and events[-1].status == "budget_exhausted"
    assert of_type(events, VerifierScore)[0].passed is False  # the verifier still judges the attempt


async def test_an_answer_at_the_last_step_is_not_a_spent_budget(nats_url: str) -> None:
    result, _ = await run(nats_url, HarnessConfig(), max_steps=2)
    assert (result.status, result.steps, result.passed) == ("completed", 2, True)


async def test_the_episode_ending_stops_the_loop(nats_url: str) -> None:
    forever = [{"tool_calls": [call(i)]} for i in range(10)]
    task = CalcTask(done_after=2)
    result, events = await run(nats_url, HarnessConfig(), task, model_config=models(forever), max_steps=2)
    assert (result.status, result.steps, task.calls) == ("completed", 2, 2)
    assert hook_events(events, "step_end")[-1].done is True


# --- infrastructure failures are recorded ---------------------------------------------------------


class CrashingTool(Tool):
    """A sandboxed tool whose sandbox dies."""

    schema = ADD

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def call(self, call: ToolCall) -> ToolResult:
        raise self.exc


@pytest.mark.parametrize(("exc", "reason"), [
    (ConnectionResetError("sandbox died"), "ConnectionResetError: sandbox died"),
    (TimeoutError("tool timed out after 30 s"), "TimeoutError: tool timed out after 30 s"),
])
async def test_a_crashing_tool_is_an_infra_failure(nats_url: str, exc: Exception, reason: str) -> None:
    task = CalcTask(tools=[CrashingTool(exc)])
    result, events = await run(nats_url, HarnessConfig(), task)
    assert (result.status, result.reason, result.passed) == ("infra_failure", reason, False)
    assert task.closed
    assert len(of_type(events, ToolInvoked)) == 1 and of_type(events, ToolReturned) == []
    finished = events[-1]
    assert isinstance(finished, AttemptFinished) and (finished.status, finished.reason) == ("infra_failure", reason)


class BrokenEnv(CalcTask):
    async def reset(self) -> str:
        raise RuntimeError("environment failed to boot")


async def test_an_environment_crash_in_reset_is_an_infra_failure(nats_url: str) -> None:
    task = BrokenEnv()
    result, events = await run(nats_url, HarnessConfig(), task)
    assert (result.status, result.reason, result.steps) == ("infra_failure",
                                                            "RuntimeError: environment failed to boot", 0)
    assert task.closed
    assert [label(e) for e in events] == ["attempt.started", "emitted:task_end", "returned:task_end",
                                          "attempt.finished"]
    assert events[-1] == AttemptFinished(run_id="r1", round=0, task_id="calc:1", attempt=0, passed=False,
                                         status="infra_failure", reason="RuntimeError: environment failed to boot")


class DownProvider(Provider):
    """A model endpoint that refuses every connection."""

    scheme = "down"

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        raise ProviderError("connection", f"{self.spec}: connection refused")


@pytest.fixture(autouse=True)
def _register_downprovider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the test provider for this module's tests only: the provider registry is global."""
    monkeypatch.setitem(providers_base.PROVIDERS._added, DownProvider.scheme, DownProvider)


async def test_provider_down_is_an_infra_failure_with_every_try_logged(nats_url: str) -> None:
    config = ModelConfig(main="down:m1", retries=2, backoff_s=0.0)
    result, events = await run(nats_url, HarnessConfig(), model_config=config)
    assert result.status == "infra_failure" and "down:m1: connection refused" in result.reason
    assert result.reason.startswith("model call failed")
    errors = of_type(events, ModelError)
    assert [(e.model, e.kind, e.try_index, e.next_action) for e in errors] == [
        ("down:m1", "connection", 0, "retry"), ("down:m1", "connection", 1, "retry"),
        ("down:m1", "connection", 2, "raise")]
    assert [r.try_index for r in of_type(events, ModelRequest)] == [0, 1, 2]
    assert isinstance(events[-1], AttemptFinished) and events[-1].status == "infra_failure"
    assert events[-1].reason == result.reason


async def test_an_unknown_provider_is_an_infra_failure(nats_url: str) -> None:
    result, events = await run(nats_url, HarnessConfig(), model_config=ModelConfig(main="nosuchscheme:model"))
    assert result.status == "infra_failure" and "unknown model provider 'nosuchscheme'" in result.reason
    assert of_type(events, ModelError)[0].next_action == "raise"
    assert isinstance(events[-1], AttemptFinished) and events[-1].reason == result.reason


async def test_fallback_in_a_run(nats_url: str) -> None:
    config = ModelConfig(main="down:m1", fallback={"main": ["script:calc"]}, retries=0,
                         provider_options={"script:calc": {"completions": TWO_STEPS}})
    result, events = await run(nats_url, HarnessConfig(), model_config=config)
    assert (result.status, result.passed) == ("completed", True)
    assert isinstance(events[0], AttemptStarted) and events[0].model == "down:m1"
    assert [(label(e), getattr(e, "model", ""), getattr(e, "try_index", -1)) for e in events
            if isinstance(e, ModelRequest | ModelResponse | ModelError)] == [
        ("model.request", "down:m1", 0), ("model.error", "down:m1", 0), ("model.request", "script:calc", 1),
        ("model.response", "script:calc", 1),
        ("model.request", "down:m1", 0), ("model.error", "down:m1", 0), ("model.request", "script:calc", 1),
        ("model.response", "script:calc", 1)]
    assert [m.model for m in hook_events(events, "after_model")] == ["script:calc", "script:calc"]


async def test_without_a_log() -> None:
    """``slots.tracer: none`` runs the loop with no event log at all (and counts what it would have written)."""
    agent = models().agentic(HarnessConfig().with_slots(tracer="none"))
    result = await agent.run(CalcTask())
    assert (result.status, result.passed, result.events) == ("completed", True, 35)


# --- determinism ------------------------------------------------------------------------------------


def busy_harness() -> HarnessConfig:
    return (HarnessConfig().attach("before_tool", Splitter()).attach("after_tool", Annotate())
            .attach("before_model", Remind()))


async def bodies(url: str, run_id: str) -> list[tuple[str, bytes]]:
    async with connect(NatsSettings(url=url)) as conn:
        agent = models([{"tool_calls": [call(1), call(2, 1, 1)]}, {"tool_calls": [call(3)]}, {"content": "5"}],
                       params={"main": {"temperature": 0.0, "seed": 3}}).agentic(busy_harness(), log=conn.log)
        for attempt in range(2):
            await agent.run(CalcTask(), run_id=run_id, attempt=attempt, seed=5)
        out = []
        for attempt in range(2):
            for event in await trace(conn.log, run_id, attempt=attempt):
                if isinstance(event, AttemptStarted | AttemptFinished):
                    event = replace(event, run_id="<run>")
                out.append((event.TYPE, encode_body(event)))
        return out


async def test_same_inputs_give_the_same_event_bodies(nats_server: NatsProcess, tmp_path: Path) -> None:
    other = NatsProcess(tmp_path / "other" / "store")
    other.start(detach=False)
    try:
        first = await bodies(nats_server.url, "det")
        second = await bodies(other.url, "det")
    finally:
        other.stop()
    third = await bodies(nats_server.url, "det-again")
    assert len(first) > 80
    assert first == second
    assert third == first  # the run id appears only in the lifecycle events' run_id field


class Teeing(LogWriter):
    """The log writer, keeping the full events the run loop handed it."""

    def __init__(self, log: EventLog) -> None:
        super().__init__(log)
        self.events: list[Event] = []

    async def write_encoded(self, subject: str, events: Sequence[Event], bodies: Sequence[EncodedEvent],
                            key: str) -> None:
        self.events += events
        await super().write_encoded(subject, events, bodies, key)


async def test_conversations_go_on_the_log_as_deltas_and_read_back_whole(nats_url: str) -> None:
    harness = busy_harness().attach("step_start", HistoryWindow(keep_last=2))
    script = [{"tool_calls": [call(i)]} for i in range(1, 7)] + [{"content": "5"}]
    async with connect(NatsSettings(url=nats_url)) as conn:
        tee = Teeing(conn.log)
        loop = RunLoop(models(script), harness.validate(), log=conn.log, writer=tee)
        result = await loop.run(CalcTask(), run_id="deltas")
        subject = trace_subject("deltas", 0, "calc:1", 0)
        raw = [r async for r in conn.log.read(subjects=[subject])]
        whole = await trace(conn.log, "deltas")
    assert result.passed and result.steps == 7
    assert whole == tee.events  # every conversation as the processors and the model saw it
    requests = of_type(whole, ModelRequest)
    assert len(requests[-1].messages) < len(hook_events(whole, "step_start", "emitted")[-1].messages)  # windowed
    assert requests[-1].messages[-1] == Message(role="user", content="step 7")  # Remind's message
    stored = [r.event for r in raw if packed(r.event) is not None]
    assert len(stored) == 7 * result.steps  # per step: step_start, before_model, step_end twice, the request
    assert all(conversation(e) == () for e in stored)
    in_full = sum(len(encode_body(e)) for e in whole if conversation(e))
    assert sum(len(encode_body(e)) for e in stored) * 3 < in_full


# --- guards: reruns, timeouts, tools filtered at task_start --------------------------------------


async def test_rerunning_a_logged_attempt_is_refused_not_silently_deduplicated(nats_url: str) -> None:
    first, _ = await run(nats_url, HarnessConfig(), run_id="again")
    assert first.passed
    with pytest.raises(AttemptExists, match="already on the log"):
        await run(nats_url, HarnessConfig(), run_id="again")
    second, events = await run(nats_url, HarnessConfig(), run_id="again", attempt=1)
    assert second.passed and of_type(events, AttemptFinished)[0].attempt == 1


class SlowTool(Tool):
    """A tool that never returns before the attempt's deadline."""

    schema = ADD

    async def call(self, call: ToolCall) -> ToolResult:
        await asyncio.Event().wait()  # blocks until cancelled by the attempt's timeout
        raise AssertionError("unreachable")


async def test_an_attempt_past_its_deadline_is_an_infra_failure_on_the_log(nats_url: str) -> None:
    task = CalcTask(tools=[SlowTool()])
    result, events = await run(nats_url, HarnessConfig(), task, timeout_s=0.5)
    assert (result.status, result.passed) == ("infra_failure", False)
    assert result.reason == "attempt timed out after 0.5s"
    [finished] = of_type(events, AttemptFinished)
    assert (finished.status, finished.reason) == ("infra_failure", "attempt timed out after 0.5s")
    assert task.closed


class DropAdd(Processor):
    """Offers no tools: the add tool is filtered out at task_start."""

    async def process(self, event: TaskStart) -> AsyncIterator[TaskStart]:
        yield replace(event, tools=())


async def test_a_tool_filtered_at_task_start_cannot_be_called(nats_url: str) -> None:
    task = CalcTask()
    harness = HarnessConfig().attach("task_start", DropAdd())
    result, events = await run(nats_url, harness, task)
    assert task.calls == 0  # the model called add anyway; the loop did not run it
    [returned] = of_type(events, ToolReturned)
    assert returned.result.is_error and "unknown tool 'add'" in returned.result.output
    assert of_type(events, ModelRequest)[0].tools == ()
    assert result.passed  # the scripted model still answers 5


class Counter(Tool):
    """A tool whose schema enumerates the only valid next number, like a text game's action list."""

    def __init__(self) -> None:
        self.value = 0

    @property
    def schema(self) -> ToolSchema:  # type: ignore[override]  # read-only here: it follows ``value``
        return ToolSchema(name="next", input_schema={"type": "object", "properties": {
            "n": {"type": "integer", "enum": [self.value + 1]}}})

    async def call(self, call: ToolCall) -> ToolResult:
        self.value = int(call.input["n"])
        return ToolResult(call_id=call.id, name=call.name, output=str(self.value))


async def test_each_step_offers_the_tools_as_the_task_states_them_now(nats_url: str) -> None:
    counter = Counter()
    task = CalcTask(tools=[counter])
    script = [{"tool_calls": [{"id": f"c{i}", "name": "next", "input": {"n": i}}]} for i in (1, 2)]
    result, events = await run(nats_url, HarnessConfig(), task, model_config=models([*script, {"content": "5"}]))
    offered = [r.tools[0].input_schema["properties"]["n"]["enum"] for r in of_type(events, ModelRequest)]
    assert offered == [[1], [2], [3]] and result.passed
