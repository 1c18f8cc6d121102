"""Hook payloads are immutable all the way down; processors get the event itself, and an edit in place fails loudly."""

from __future__ import annotations

import copy
import pickle
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import FunctionTool, HarnessConfig, ModelConfig, Processor, Task
from hx.harness.contracts import check_contract
from hx.harness.errors import ContractViolation, InPlaceEdit
from hx.processors.testing import KitFailure, check_processor
from hx.runtime.errors import ProcessorFailed
from hx.runtime.pipeline import HookPipeline
from schemas.errors import FrozenValueError
from schemas.event import Event
from schemas.frozen import FrozenDict, FrozenList, freeze, reading_log
from schemas.history import resolve_async
from schemas.hooks import (
    HOOK_OF,
    AfterTool,
    BeforeModel,
    BeforeTool,
    HookName,
    HookPayload,
    HookRecord,
    ProcessorTriggered,
    StepStart,
    TaskStart,
)
from schemas.lifecycle import AttemptFinished
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelRequest
from schemas.tools import VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject

replace = msgspec.structs.replace

NESTED: dict[str, Any] = {"type": "object", "required": ["action"], "properties": {
    "action": {"type": "string", "enum": ["look", "take key"]}, "times": {"type": "integer"}},
    "empty": {}, "pairs": [[1, 2], {"k": [None, 1.5, True]}]}
ACT = ToolSchema(name="act", description="Act.", input_schema=NESTED)
CALL = ToolCall(id="c1", name="act", input={"action": "look", "tags": ["a", "b"]})
SPEC = TaskSpec(id="frozen:1", instruction="look", meta={"game": "coin", "levels": [1, 2]})
HISTORY = (Message(role="user", content="look"), Message(role="assistant", tool_calls=(CALL,)),
           Message(role="tool", content="a room", tool_call_id="c1", name="act"))


# --- the frozen values ------------------------------------------------------------------------------------


def test_values_entering_a_payload_are_frozen_deeply_when_made_replaced_or_decoded() -> None:
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(ACT), type=ToolSchema)
    converted = msgspec.convert(msgspec.to_builtins(CALL), ToolCall)
    replaced = replace(CALL, input={"action": "take key", "n": [1]})
    for value in (ACT.input_schema, decoded.input_schema, CALL.input, converted.input, replaced.input,
                  SPEC.meta, ToolResult(call_id="c", name="act", output="", data={"score": [1]}).data):
        assert type(value) is FrozenDict
    props = ACT.input_schema["properties"]
    assert type(props["action"]["enum"]) is FrozenList and type(ACT.input_schema["pairs"][1]["k"]) is FrozenList
    assert type(replaced.input["n"]) is FrozenList and type(SPEC.meta["levels"]) is FrozenList


def test_freezing_costs_only_new_data_a_frozen_value_is_kept_as_is() -> None:
    assert freeze(CALL.input) is CALL.input
    assert ToolCall(id="c2", name="act", input=CALL.input).input is CALL.input
    assert replace(CALL, id="c3").input is CALL.input
    assert replace(ACT, description="Other.").input_schema is ACT.input_schema
    assert ToolSchema(name="x").input_schema is ToolSchema(name="y").input_schema  # one shared empty object
    made = FrozenDict({"a": [1, {"b": []}]}, c={"d": 1})  # made directly, not by freeze: frozen all the same
    assert type(made["a"]) is FrozenList and type(made["a"][1]["b"]) is FrozenList and type(made["c"]) is FrozenDict
    assert type(FrozenList([[1], {"e": 2}])[1]) is FrozenDict


def test_frozen_values_encode_to_the_same_bytes_and_compare_equal_to_plain_ones() -> None:
    frozen = freeze(NESTED)
    for encode in (msgspec.msgpack.encode, msgspec.json.encode):
        assert encode(frozen) == encode(NESTED)
        assert encode(ACT) == encode(msgspec.structs.asdict(ACT) | {"input_schema": NESTED})
    # both sides on purpose: a plain dict or list on the left compares too
    assert frozen == NESTED and NESTED == frozen and frozen != {}  # noqa: SIM300
    enum = frozen["properties"]["action"]["enum"]
    assert enum == ["look", "take key"] and ["look", "take key"] == enum and isinstance(enum, list)  # noqa: SIM300
    assert ToolSchema(name="act", description="Act.", input_schema=dict(NESTED)) == ACT
    assert dict(frozen) == NESTED and type(dict(frozen)) is dict and type(list(enum)) is list


def test_frozen_values_survive_pickle_and_copy_still_frozen() -> None:
    for again in (pickle.loads(pickle.dumps(ACT)).input_schema, copy.deepcopy(ACT.input_schema),
                  copy.copy(ACT.input_schema)):
        assert again == NESTED and type(again) is FrozenDict
        assert type(again["properties"]["action"]["enum"]) is FrozenList
    assert pickle.loads(pickle.dumps(FrozenList([1, [2]]))) == [1, [2]]


MUTATIONS: list[tuple[str, Callable[[Any], Any]]] = [
    ("__setitem__", lambda d: d.__setitem__("action", "x")),
    ("__delitem__", lambda d: d.__delitem__("action")),
    ("__ior__", lambda d: d.__ior__({"x": 1})),
    ("clear", lambda d: d.clear()),
    ("pop", lambda d: d.pop("action")),
    ("popitem", lambda d: d.popitem()),
    ("setdefault", lambda d: d.setdefault("x", 1)),
    ("update", lambda d: d.update(x=1)),
    ("append", lambda d: d["tags"].append("c")),
    ("extend", lambda d: d["tags"].extend(["c"])),
    ("insert", lambda d: d["tags"].insert(0, "c")),
    ("remove", lambda d: d["tags"].remove("a")),
    ("sort", lambda d: d["tags"].sort()),
    ("reverse", lambda d: d["tags"].reverse()),
    ("__setitem__", lambda d: d["tags"].__setitem__(0, "c")),
    ("__delitem__", lambda d: d["tags"].__delitem__(0)),
    ("__iadd__", lambda d: d["tags"].__iadd__(["c"])),
    ("__imul__", lambda d: d["tags"].__imul__(2)),
    ("clear", lambda d: d["tags"].clear()),
    ("pop", lambda d: d["tags"].pop()),
]


@pytest.mark.parametrize(("method", "mutate"), MUTATIONS, ids=[f"{i}-{m}" for i, (m, _) in enumerate(MUTATIONS)])
def test_every_mutator_is_refused_naming_the_fix(method: str, mutate: Callable[[Any], Any]) -> None:
    before = msgspec.msgpack.encode(CALL)
    with pytest.raises(FrozenValueError, match=rf"hook payloads are immutable: Frozen(Dict|List)\.{method}\(") as err:
        mutate(CALL.input)
    assert isinstance(err.value, TypeError) and "msgspec.structs.replace" in str(err.value)
    assert msgspec.msgpack.encode(CALL) == before


# --- the pipeline: the event itself, and edits in place refused -----------------------------------------------


class Witness(Processor):
    """Remembers the event it was given and passes it on."""

    async def process(self, event: Any) -> AsyncIterator[Any]:
        SEEN.append(event)
        yield event


SEEN: list[Any] = []


async def test_processors_get_the_event_itself_and_pass_it_on_unchanged() -> None:
    SEEN.clear()
    emitted: list[Event] = []
    event = StepStart(step=3, messages=HISTORY)
    returned = await HookPipeline("step_start", [Witness(), Witness()], emitted.append).run(event, 3)
    assert len(SEEN) == 2 and all(seen is event for seen in SEEN)
    assert returned[0] is event
    assert [type(e) for e in emitted] == [HookRecord, HookRecord]


class InPlace(Processor):
    """Applies one of ``EDITS`` to its input in place and yields the input (what a careless processor does)."""

    dimension = "D4"
    index: int

    async def process(self, event: Any) -> AsyncIterator[Any]:
        EDITS[self.index][2](event)
        yield event


def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


EDITS: list[tuple[HookPayload, str, Callable[[Any], None]]] = [
    (BeforeTool(step=1, call=CALL), "<event>", lambda e: _set(e, "approved", False)),
    (BeforeTool(step=1, call=CALL), "<ToolCall>", lambda e: _set(e.call, "name", "other")),
    (StepStart(step=1, messages=HISTORY), "<Message>", lambda e: _set(e.messages[0], "content", "x")),
    (BeforeTool(step=1, call=CALL), "call.input", lambda e: e.call.input.__setitem__("action", "take key")),
    (BeforeTool(step=1, call=CALL), "call.input['tags']", lambda e: e.call.input["tags"].append("c")),
    (BeforeModel(step=1, messages=HISTORY, tools=(ACT,)), "tools[0].input_schema['properties']['action']['enum']",
     lambda e: e.tools[0].input_schema["properties"]["action"]["enum"].append("dance")),
    (StepStart(step=1, messages=HISTORY), "messages[1].tool_calls[0].input",
     lambda e: e.messages[1].tool_calls[0].input.pop("action")),
    (AfterTool(step=1, call=CALL, result=ToolResult(call_id="c1", name="act", output="", data={"score": 1})),
     "result.data", lambda e: e.result.data.update(score=2)),
    (TaskStart(task=SPEC, tools=(ACT,)), "task.meta", lambda e: e.task.meta.clear()),
]


@pytest.mark.parametrize("index", range(len(EDITS)), ids=[f"{i}-{f}" for i, (_, f, _e) in enumerate(EDITS)])
async def test_an_edit_in_place_fails_loudly_and_the_logged_event_is_unchanged(index: int) -> None:
    event, field, _ = EDITS[index]
    hook: HookName = HOOK_OF[type(event)]
    before = msgspec.msgpack.encode(event)
    emitted: list[Event] = []
    pipe = HookPipeline(hook, [InPlace(index=index)], emitted.append)
    with pytest.raises(InPlaceEdit) as err:
        await pipe.run(event, 1)
    assert isinstance(err.value, ContractViolation)
    assert (err.value.processor, err.value.hook, err.value.field) == (InPlace.type_name(), hook, field)
    assert "in place" in str(err.value) and "msgspec.structs.replace" in str(err.value)
    record, trigger = emitted
    assert isinstance(record, HookRecord) and record.stage == "emitted" and record.event is event
    assert msgspec.msgpack.encode(record.event) == before
    assert isinstance(trigger, ProcessorTriggered) and trigger.action == "interrupted"
    assert trigger.reason == str(err.value)


class Clumsy(Processor):
    """Reads an attribute its input does not have: a plain bug, not an edit in place."""

    async def process(self, event: Any) -> AsyncIterator[Any]:
        yield event.no_such_field


async def test_the_kit_and_the_pipeline_tell_an_edit_in_place_from_a_plain_bug() -> None:
    with pytest.raises(KitFailure, match=r"mutated its input in place \(call\.input\): hook payloads are immutable"):
        await check_processor(InPlace(index=3), [BeforeTool(step=1, call=CALL)])
    with pytest.raises(ProcessorFailed, match="AttributeError") as err:
        await HookPipeline("before_tool", [Clumsy()], lambda e: None).run(BeforeTool(step=1, call=CALL), 1)
    assert not isinstance(err.value, ContractViolation)


def test_a_narrowed_enum_built_from_a_frozen_schema_is_permitted() -> None:
    before = BeforeModel(step=1, messages=HISTORY, tools=(ACT,))
    schema = ACT.input_schema
    assert type(schema["properties"]["action"]["enum"]) is FrozenList  # compared with the plain list built below
    action = {**schema["properties"]["action"], "enum": ["take key"]}
    narrowed = replace(ACT, input_schema={**schema, "properties": {**schema["properties"], "action": action}})
    assert check_contract("p", "before_model", before, replace(before, tools=(narrowed,), offered=(ACT,))) == [
        "tools[0].input_schema", "offered"]


# --- in a real run: the attempt ends as interrupted, the log keeps what was emitted ----------------------------


class Game(Task):
    """One tool with an enumerated action; the script calls it once, then answers."""

    system_prompt = "Play."

    def __init__(self) -> None:
        self.spec = SPEC
        self._tools = [FunctionTool(ACT, lambda action, times=1: f"you {action}")]

    def tools(self) -> list[FunctionTool]:
        return self._tools

    async def reset(self) -> str:
        return self.spec.instruction

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="any", passed=True, score=1.0)


MODELS = ModelConfig(main="script:game", provider_options={"script:game": {"completions": [
    {"content": "", "tool_calls": [{"id": "c1", "name": "act", "input": {"action": "look"}}],
     "stop_reason": "tool_use"},
    {"content": "done", "stop_reason": "end_turn"},
]}})


@pytest.mark.parametrize("index", [0, 3, 5])
async def test_an_edit_in_place_in_a_run_interrupts_the_attempt(nats_url: str, index: int) -> None:
    event, field, _ = EDITS[index]
    hook: HookName = HOOK_OF[type(event)]
    run_id = f"inplace-{index}"
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = MODELS.agentic(HarnessConfig().attach(hook, InPlace(index=index)), log=conn.log)
        result = await agent.run(Game(), run_id=run_id, max_steps=3)
        events = [r.event async for r in resolve_async(conn.log.read(subjects=[trace_subject(run_id, 0, SPEC.id, 0)]))]
    assert (result.status, result.passed) == ("interrupted", False)
    assert f"processor {InPlace.type_name()!r} at hook {hook!r} tried to change {field!r}" in result.reason
    finished = events[-1]
    assert isinstance(finished, AttemptFinished)
    assert (finished.status, finished.reason) == ("interrupted", result.reason)
    (trigger,) = [e for e in events if isinstance(e, ProcessorTriggered)]
    assert (trigger.hook, trigger.action, trigger.reason) == (hook, "interrupted", result.reason)
    (emitted,) = [e.event for e in events if isinstance(e, HookRecord) and HOOK_OF[type(e.event)] == hook]
    if isinstance(emitted, BeforeModel):
        assert emitted.tools == (ACT,) and not any(isinstance(e, ModelRequest) for e in events)
    else:
        assert isinstance(emitted, BeforeTool) and emitted.call.input == {"action": "look"} and emitted.approved


# --- values read back from the log: plain while read, frozen where a replay feeds them to the run loop -------


def _as_read(value: Any) -> Any:
    """``value`` as a reader gets it from the log (decoded there, so not frozen)."""
    with reading_log():
        return msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=type(value))


def test_values_read_from_the_log_are_left_as_decoded() -> None:
    assert type(_as_read(ACT).input_schema) is dict and type(_as_read(CALL).input) is dict
    assert type(_as_read(SPEC).meta) is dict  # reading a large log does not pay for freezing


class LoggedGame(Game):
    """The game with its task and tool as a replay reads them back from the log: decoded, not frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.spec = _as_read(SPEC)
        self._tools = [FunctionTool(_as_read(ACT), lambda action, times=1: f"you {action}")]


@pytest.mark.parametrize("index", [5, 8])
async def test_values_from_the_log_are_frozen_where_they_enter_a_hook_payload(nats_url: str, index: int) -> None:
    event, field, _ = EDITS[index]
    hook: HookName = HOOK_OF[type(event)]
    game = LoggedGame()
    assert type(game.spec.meta) is dict and type(game.tools()[0].schema.input_schema) is dict
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = MODELS.agentic(HarnessConfig().attach(hook, InPlace(index=index)), log=conn.log)
        result = await agent.run(game, run_id=f"logged-{index}", max_steps=3)
    assert (result.status, result.passed) == ("interrupted", False)
    assert f"processor {InPlace.type_name()!r} at hook {hook!r} tried to change {field!r}" in result.reason
