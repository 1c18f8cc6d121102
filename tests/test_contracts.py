"""Hook contracts: what each hook lets a processor change, enforced at unit level and in real runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import (
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    ContractViolation,
    FunctionTool,
    HarnessConfig,
    ModelConfig,
    Processor,
    StepEnd,
    StepStart,
    Task,
    TaskEnd,
    TaskStart,
)
from hx.harness.contracts import check_contract
from hx.runtime.pipeline import HookPipeline
from schemas.event import Event
from schemas.history import resolve_async
from schemas.hooks import HOOK_NAMES, HookName, HookPayload, HookRecord, ProcessorTriggered
from schemas.lifecycle import AttemptFinished
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelResponse
from schemas.tools import ToolInvoked, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import trace_subject

replace = msgspec.structs.replace

CALL = ToolCall(id="c1", name="echo", input={"text": "hi"})
SPEC = TaskSpec(id="echo:1", instruction="echo hi, then say done")
HISTORY = (
    Message(role="system", content="You echo."),
    Message(role="user", content="echo hi, then say done"),
    Message(role="assistant", tool_calls=(CALL,)),
    Message(role="tool", content="hi", tool_call_id="c1", name="echo"),
)
SAMPLES: dict[HookName, HookPayload] = {
    "task_start": TaskStart(task=SPEC, system_prompt="You echo.", tools=(ToolSchema(name="echo"),)),
    "step_start": StepStart(step=2, messages=HISTORY),
    "before_model": BeforeModel(step=2, messages=HISTORY, tools=(ToolSchema(name="echo"),)),
    "after_model": AfterModel(step=2, tool_calls=(CALL,), stop_reason="tool_use", model="script:echo"),
    "before_tool": BeforeTool(step=2, call=CALL),
    "after_tool": AfterTool(step=2, call=CALL, result=ToolResult(call_id="c1", name="echo", output="hi")),
    "step_end": StepEnd(step=2, messages=HISTORY),
    "task_end": TaskEnd(task_id="echo:1", passed=True, score=1.0, steps=2),
}

Edit = Callable[[Any], Any]

PERMITTED: list[tuple[HookName, str, Edit]] = [
    ("task_start", "system prompt", lambda e: replace(e, system_prompt="Be brief.")),
    ("step_start", "drop the system message", lambda e: replace(e, messages=e.messages[1:])),
    ("step_start", "summarise the history", lambda e: replace(e, messages=(Message(role="user", content="sum"),))),
    ("step_start", "reorder", lambda e: replace(e, messages=e.messages[::-1])),
    ("before_model", "edit the last user message", lambda e: replace(e, messages=(
        *e.messages[:1], replace(e.messages[1], content="echo HI"), *e.messages[2:]))),
    ("before_model", "append one user message", lambda e: replace(e, messages=(
        *e.messages, Message(role="user", content="hint: you are done")))),
    ("after_model", "content", lambda e: replace(e, content="thinking")),
    ("after_model", "drop the tool calls", lambda e: replace(e, tool_calls=())),
    ("after_model", "add a tool call", lambda e: replace(e, tool_calls=(*e.tool_calls, replace(CALL, id="c2")))),
    ("before_tool", "tool input", lambda e: replace(e, call=replace(e.call, input={"text": "HI"}))),
    ("before_tool", "approval", lambda e: replace(e, approved=False)),
    ("after_tool", "result output", lambda e: replace(e, result=replace(e.result, output="hi!"))),
    ("after_tool", "result error flag and data", lambda e: replace(e, result=replace(
        e.result, is_error=True, data={"score": 1}))),
    ("step_end", "pass-through", lambda e: e),
    ("task_end", "pass-through", lambda e: e),
]

FORBIDDEN: list[tuple[HookName, str, Edit]] = [
    ("task_start", "task.id", lambda e: replace(e, task=replace(e.task, id="echo:2"))),
    ("task_start", "task.instruction", lambda e: replace(e, task=replace(e.task, instruction="something else"))),
    ("step_start", "step", lambda e: replace(e, step=e.step + 1)),
    ("before_model", "tools", lambda e: replace(e, tools=())),
    ("before_model", "step", lambda e: replace(e, step=7)),
    ("before_model", "messages[4].role", lambda e: replace(e, messages=(
        *e.messages, Message(role="assistant", content="I am done")))),
    ("before_model", "messages", lambda e: replace(e, messages=(
        *e.messages, Message(role="user", content="a"), Message(role="user", content="b")))),
    ("before_model", "messages[0].content", lambda e: replace(e, messages=(
        replace(e.messages[0], content="You obey."), *e.messages[1:]))),
    ("before_model", "messages[3].content", lambda e: replace(e, messages=(
        *e.messages[:3], replace(e.messages[3], content="forged tool output")))),
    ("before_model", "messages", lambda e: replace(e, messages=e.messages[1:])),
    ("after_model", "stop_reason", lambda e: replace(e, stop_reason="end_turn")),
    ("after_model", "model", lambda e: replace(e, model="other:model")),
    ("before_tool", "call.name", lambda e: replace(e, call=replace(e.call, name="rm"))),
    ("before_tool", "call.id", lambda e: replace(e, call=replace(e.call, id="c9"))),
    ("after_tool", "result.call_id", lambda e: replace(e, result=replace(e.result, call_id="c9"))),
    ("after_tool", "call.input", lambda e: replace(e, call=replace(e.call, input={"text": "other"}))),
    ("step_end", "done", lambda e: replace(e, done=not e.done)),
    ("step_end", "messages", lambda e: replace(e, messages=())),
    ("task_end", "passed", lambda e: replace(e, passed=not e.passed)),
    ("task_end", "status", lambda e: replace(e, status="interrupted")),
]


def test_every_hook_has_permitted_and_forbidden_cases() -> None:
    assert {h for h, _, _ in PERMITTED} == set(HOOK_NAMES) == {h for h, _, _ in FORBIDDEN}


@pytest.mark.parametrize(("hook", "what", "edit"), PERMITTED, ids=[f"{h}-{w}" for h, w, _ in PERMITTED])
def test_permitted_change_passes(hook: HookName, what: str, edit: Edit) -> None:
    before = SAMPLES[hook]
    after = edit(before)
    changed = check_contract("test:Editor", hook, before, after)
    assert (changed == []) == (after == before)


@pytest.mark.parametrize(("hook", "field", "edit"), FORBIDDEN, ids=[f"{h}-{f}" for h, f, _ in FORBIDDEN])
def test_forbidden_change_raises_naming_processor_hook_and_field(hook: HookName, field: str, edit: Edit) -> None:
    with pytest.raises(ContractViolation) as err:
        check_contract("test:Editor", hook, SAMPLES[hook], edit(SAMPLES[hook]))
    assert (err.value.processor, err.value.hook, err.value.field) == ("test:Editor", hook, field)
    msg = str(err.value)
    assert "'test:Editor'" in msg and f"'{hook}'" in msg and f"'{field}'" in msg


def test_before_model_only_the_last_user_message_is_editable() -> None:
    messages = (Message(role="user", content="first"), Message(role="assistant", content="ok"),
                Message(role="user", content="second"))
    before = BeforeModel(step=3, messages=messages)
    last = replace(before, messages=(*messages[:2], replace(messages[2], content="second, edited")))
    assert check_contract("p", "before_model", before, last) == ["messages[2].content"]
    earlier = replace(before, messages=(replace(messages[0], content="first, edited"), *messages[1:]))
    with pytest.raises(ContractViolation) as err:
        check_contract("p", "before_model", before, earlier)
    assert err.value.field == "messages[0].content"
    role = replace(before, messages=(*messages[:2], replace(messages[2], role="system")))
    with pytest.raises(ContractViolation, match=r"messages\[2\]\.role"):
        check_contract("p", "before_model", before, role)


def test_yielding_another_event_type_is_a_violation() -> None:
    with pytest.raises(ContractViolation) as err:
        check_contract("p", "before_tool", SAMPLES["before_tool"], SAMPLES["after_tool"])
    assert err.value.field == "<event type>" and "AfterTool" in str(err.value)


class Mutator(Processor):
    """Edits its input's dicts in place and yields the same object (what a careless processor tries)."""

    async def process(self, event: AfterModel | BeforeTool) -> AsyncIterator[AfterModel | BeforeTool]:
        if isinstance(event, BeforeTool):
            event.call.input["text"] = "mutated"
        else:
            event.tool_calls[0].input["text"] = "mutated"
        yield event


@pytest.mark.parametrize("hook", ["before_tool", "after_model"])
async def test_in_place_mutation_is_caught_and_the_input_is_untouched(hook: HookName) -> None:
    emitted: list[Event] = []
    pipe = HookPipeline(hook, [Mutator()], emitted.append)
    event = SAMPLES[hook]
    with pytest.raises(ContractViolation) as err:
        await pipe.run(event, 2)
    field = "call.input" if hook == "before_tool" else "tool_calls[0].input"
    assert (err.value.processor, err.value.hook, err.value.field) == (Mutator.type_name(), hook, field)
    assert "in place" in str(err.value)
    assert CALL.input == {"text": "hi"} and event == SAMPLES[hook]
    record, trigger = emitted
    assert isinstance(record, HookRecord) and record.event == event
    assert isinstance(trigger, ProcessorTriggered) and trigger.action == "interrupted" and field in trigger.reason


# --- in real runs -----------------------------------------------------------------------------


class Editor(Processor):
    """Applies one of the edits above at one step of whatever hook it is attached to."""

    table: str
    index: int
    at_step: int = 0
    """The step to edit at (0: task_start and task_end, which have no step)."""

    async def process(self, event: Any) -> AsyncIterator[Any]:
        _, _, edit = (PERMITTED if self.table == "permitted" else FORBIDDEN)[self.index]
        yield edit(event) if getattr(event, "step", 0) == self.at_step else event


# In a run of the echo task, the event at this step has the shape of the hook's sample above.
SAMPLE_STEP: dict[HookName, int] = {"task_start": 0, "step_start": 2, "before_model": 2, "after_model": 1,
                                    "before_tool": 1, "after_tool": 1, "step_end": 2, "task_end": 0}
HOOK_EVENT_NAME = {type(e): h for h, e in SAMPLES.items()}


class EchoTask(Task):
    """Two steps: the script calls ``echo`` once, then answers ``done``."""

    system_prompt = "You echo."

    def __init__(self) -> None:
        self.spec = SPEC
        self._tools = [FunctionTool(ToolSchema(name="echo"), lambda text: text)]

    def tools(self) -> list[FunctionTool]:
        return self._tools

    async def reset(self) -> str:
        return self.spec.instruction

    async def verify(self, final_answer: str) -> VerifierScore:
        ok = final_answer.startswith("done")
        return VerifierScore(verifier="prefix", passed=ok, score=float(ok))


MODELS = ModelConfig(main="script:echo", provider_options={"script:echo": {"completions": [
    {"content": "", "tool_calls": [{"id": "c1", "name": "echo", "input": {"text": "hi"}}], "stop_reason": "tool_use"},
    {"content": "done", "stop_reason": "end_turn"},
]}})


async def trace(log: EventLog, run_id: str) -> list[Event]:
    return [r.event async for r in resolve_async(log.read(subjects=[trace_subject(run_id, 0, SPEC.id, 0)]))]


def hook_records(events: list[Event], hook: HookName, stage: str) -> list[HookRecord]:
    return [e for e in events if isinstance(e, HookRecord) and e.stage == stage
            and HOOK_EVENT_NAME[type(e.event)] == hook]


@pytest.mark.parametrize("index", range(len(PERMITTED)), ids=[f"{h}-{w}" for h, w, _ in PERMITTED])
async def test_permitted_change_in_a_run(nats_url: str, index: int) -> None:
    hook, _, edit = PERMITTED[index]
    run_id = f"ok-{index}"
    editor = Editor(table="permitted", index=index, at_step=SAMPLE_STEP[hook])
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = MODELS.agentic(HarnessConfig().attach(hook, editor), log=conn.log)
        result = await agent.run(EchoTask(), run_id=run_id, max_steps=4)
        events = await trace(conn.log, run_id)
    assert (result.status, result.reason) == ("completed", "")
    finished = events[-1]
    assert isinstance(finished, AttemptFinished) and finished.status == "completed"
    triggers = [e for e in events if isinstance(e, ProcessorTriggered)]
    expected = check_contract("-", hook, SAMPLES[hook], edit(SAMPLES[hook]))
    if not expected:
        assert triggers == []
        return
    (trigger,) = triggers
    assert (trigger.processor, trigger.group, trigger.hook) == (Editor.type_name(), Editor.group(), hook)
    assert (trigger.action, trigger.fields, trigger.step) == ("changed", tuple(expected), SAMPLE_STEP[hook])
    # the changed event is what the hook returned, and what the loop went on with
    (returned,) = [r for r in hook_records(events, hook, "returned") if r.step == SAMPLE_STEP[hook]]
    (emitted,) = [r for r in hook_records(events, hook, "emitted") if r.step == SAMPLE_STEP[hook]]
    assert returned.event == edit(emitted.event) != emitted.event


@pytest.mark.parametrize("index", range(len(FORBIDDEN)), ids=[f"{h}-{f}" for h, f, _ in FORBIDDEN])
async def test_forbidden_change_in_a_run_interrupts_the_attempt(nats_url: str, index: int) -> None:
    hook, field, _ = FORBIDDEN[index]
    run_id = f"bad-{index}"
    editor = Editor(table="forbidden", index=index, at_step=SAMPLE_STEP[hook])
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = MODELS.agentic(HarnessConfig().attach(hook, editor), log=conn.log)
        result = await agent.run(EchoTask(), run_id=run_id, max_steps=4)
        events = await trace(conn.log, run_id)
    assert (result.status, result.passed) == ("interrupted", False)
    assert f"processor {Editor.type_name()!r} at hook {hook!r} changed {field!r}" in result.reason
    finished = events[-1]
    assert isinstance(finished, AttemptFinished)
    assert (finished.status, finished.reason, finished.passed) == ("interrupted", result.reason, False)
    (trigger,) = [e for e in events if isinstance(e, ProcessorTriggered)]
    assert (trigger.processor, trigger.hook, trigger.action) == (Editor.type_name(), hook, "interrupted")
    assert trigger.step == SAMPLE_STEP[hook] and trigger.reason == result.reason
    # the violating event never propagated: the hook returned nothing at that step
    assert [r for r in hook_records(events, hook, "emitted") if r.step == SAMPLE_STEP[hook]]
    assert not [r for r in hook_records(events, hook, "returned") if r.step == SAMPLE_STEP[hook]]
    if hook != "task_end":
        assert not hook_records(events, "step_start", "emitted")[SAMPLE_STEP[hook]:], "nothing ran after"


async def test_in_place_mutation_in_a_run_keeps_the_log_intact(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        for hook in ("after_model", "before_tool"):
            agent = MODELS.agentic(HarnessConfig().attach(hook, Mutator()), log=conn.log)
            result = await agent.run(EchoTask(), run_id=f"mutate-{hook}")
            events = await trace(conn.log, f"mutate-{hook}")
            assert result.status == "interrupted" and "of its input in place" in result.reason
            assert Mutator.type_name() in result.reason and hook in result.reason
            assert not any(isinstance(e, ToolInvoked) for e in events)
            (response,) = [e for e in events if isinstance(e, ModelResponse)]
            assert response.tool_calls[0].input == {"text": "hi"}
            (emitted,) = [r.event for r in hook_records(events, hook, "emitted")]
            calls = emitted.tool_calls if isinstance(emitted, AfterModel) else (emitted.call,)  # type: ignore[union-attr]
            assert calls[0].input == {"text": "hi"}
            (trigger,) = [e for e in events if isinstance(e, ProcessorTriggered)]
            assert trigger.action == "interrupted" and trigger.hook == hook


# --- narrowing the offer at before_model, correcting the tool name at before_tool ----------------------------


def _game_tool(*values: str, description: str = "Act.") -> ToolSchema:
    return ToolSchema(name="act", description=description, input_schema={
        "type": "object", "required": ["action"],
        "properties": {"action": {"type": "string", "enum": list(values)}, "times": {"type": "integer"}}})


SHELL = ToolSchema(name="shell", description="Run.", input_schema={"type": "object", "properties": {
    "cmd": {"type": "string"}}})
OFFER = (_game_tool("look", "go north", "go south", "take key"), SHELL)
STEP = BeforeModel(step=1, messages=HISTORY[:2], tools=OFFER)


def test_a_narrowing_that_keeps_the_offer_passes() -> None:
    narrowed = replace(STEP, tools=(_game_tool("look", "take key"),), offered=OFFER)
    assert set(check_contract("p", "before_model", STEP, narrowed)) >= {"offered"}
    further = replace(narrowed, tools=(_game_tool("take key"),))  # a later processor narrows again
    assert check_contract("q", "before_model", narrowed, further)
    restored = replace(narrowed, tools=OFFER)  # back up to the offer, never past it
    assert check_contract("q", "before_model", narrowed, restored)
    same = replace(STEP, offered=OFFER)  # recording the offer without narrowing
    assert check_contract("p", "before_model", STEP, same) == ["offered"]
    with_note = replace(narrowed, messages=(*STEP.messages, Message(role="user", content="hint")), route="judge")
    assert check_contract("p", "before_model", STEP, with_note)


NOT_NARROWINGS: list[tuple[str, str, Any]] = [
    ("widen an enum", "tools[0].input_schema", (_game_tool("look", "go north", "go south", "take key", "jump"),)),
    ("reorder values", "tools[0].input_schema", (_game_tool("go north", "look"),)),
    ("empty an enum", "tools[0].input_schema", (_game_tool(),)),
    ("change a description", "tools[0].description", (_game_tool("look", description="Other."),)),
    ("add a tool", "tools[2]", (*OFFER, ToolSchema(name="extra"))),
    ("reorder tools", "tools[1]", (SHELL, OFFER[0])),
    ("drop every tool", "tools", ()),
    ("change another schema field", "tools[0].input_schema", (ToolSchema(
        name="act", description="Act.", input_schema={**OFFER[0].input_schema, "required": []}),)),
    ("retype an enumerated property", "tools[0].input_schema", (ToolSchema(
        name="act", description="Act.", input_schema={**OFFER[0].input_schema, "properties": {
            "action": {"type": "number", "enum": ["look"]}, "times": {"type": "integer"}}}),)),
]


@pytest.mark.parametrize(("what", "field", "tools"), NOT_NARROWINGS, ids=[w for w, _, _ in NOT_NARROWINGS])
def test_anything_but_a_narrowing_is_a_violation(what: str, field: str, tools: tuple[ToolSchema, ...]) -> None:
    with pytest.raises(ContractViolation) as err:
        check_contract("p", "before_model", STEP, replace(STEP, tools=tools, offered=OFFER))
    assert err.value.field == field and "narrowing the tools" in str(err.value)


def test_the_offer_must_be_kept_in_offered() -> None:
    narrowed = replace(STEP, tools=(_game_tool("look"),), offered=OFFER)
    with pytest.raises(ContractViolation) as err:  # narrowing without recording the offer
        check_contract("p", "before_model", STEP, replace(STEP, tools=(_game_tool("look"),)))
    assert err.value.field == "tools"
    with pytest.raises(ContractViolation) as err:  # dropping the record a processor before made
        check_contract("q", "before_model", narrowed, replace(narrowed, offered=()))
    assert err.value.field == "offered"
    with pytest.raises(ContractViolation) as err:  # changing it
        check_contract("q", "before_model", narrowed, replace(narrowed, offered=(OFFER[0],)))
    assert err.value.field == "offered"
    with pytest.raises(ContractViolation) as err:  # "narrowing" to more than the offer by rewriting offered
        wider = (_game_tool("look", "go north", "go south", "take key", "jump"), SHELL)
        check_contract("p", "before_model", STEP, replace(STEP, tools=wider, offered=wider))
    assert err.value.field == "offered"


def test_before_tool_may_correct_the_tool_name_only_to_an_offered_one() -> None:
    event = BeforeTool(step=1, call=replace(CALL, name="Echo "), offered=("echo", "shell"))
    fixed = replace(event, call=replace(event.call, name="echo", input={"text": "HI"}))
    assert check_contract("p", "before_tool", event, fixed) == ["call.name", "call.input"]
    with pytest.raises(ContractViolation) as err:
        check_contract("p", "before_tool", event, replace(event, call=replace(event.call, name="rm")))
    assert err.value.field == "call.name"
    with pytest.raises(ContractViolation) as err:
        check_contract("p", "before_tool", event, replace(event, offered=("echo", "shell", "rm")))
    assert err.value.field == "offered"
    with pytest.raises(ContractViolation) as err:  # nothing offered: no name is a correction
        check_contract("p", "before_tool", SAMPLES["before_tool"], replace(
            SAMPLES["before_tool"], call=replace(CALL, name="shell")))
    assert err.value.field == "call.name"
