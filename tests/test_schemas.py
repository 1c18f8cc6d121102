"""The log's vocabulary: every event type round-trips, decoding is strict, encoding is deterministic."""

from __future__ import annotations

import time
import typing
from typing import Any

import msgspec
import pytest

import schemas
from schemas import (
    FRAME_TYPE,
    HOOK_EVENT_TYPES,
    HOOK_NAMES,
    HX_COUNT,
    HX_SCHEMA_VERSION,
    HX_TIME,
    HX_TYPE,
    MSG_ID,
    AfterModel,
    AfterTool,
    AttemptFinished,
    AttemptStarted,
    BeforeModel,
    BeforeTool,
    DecodeError,
    EnvObservation,
    Event,
    HookRecord,
    HxError,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    ProcessorTriggered,
    Record,
    RoundFinished,
    RoundStarted,
    RunFinished,
    RunStarted,
    SchemaError,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskSpec,
    TaskStart,
    TokenLogprob,
    ToolCall,
    ToolInvoked,
    ToolResult,
    ToolReturned,
    ToolSchema,
    TopLogprob,
    Usage,
    VerifierScore,
    decode_body,
    decode_frame,
    encode_body,
    encode_frame,
    event_type,
    event_types,
    headers_for,
)
from schemas.envelope import DEFLATE, HX_ENCODING, decode_message, deflate
from schemas.event import register

# --- representative instances ------------------------------------------------------------

TASK = TaskSpec(id="twx:coin:dev:17", instruction="find the coin", benchmark="twx", split="dev", seed=17,
                meta={"difficulty": 3, "tags": ["coin", "kitchen"], "nested": {"x": 1.5, "ok": None}})
TOOL = ToolSchema(name="go", description="move somewhere",
                  input_schema={"type": "object", "properties": {"where": {"type": "string"}}})
CALL = ToolCall(id="call_1", name="go", input={"where": "north", "steps": 2, "fast": True})
RESULT = ToolResult(call_id="call_1", name="go", output="You are in the kitchen.", is_error=False,
                    data={"score": 0.5, "flags": ["moved"]})
MESSAGES = (
    Message(role="system", content="You are an agent."),
    Message(role="user", content="Find the coin. ünïcode ✓"),
    Message(role="assistant", content="", tool_calls=(CALL,)),
    Message(role="tool", content="You are in the kitchen.", tool_call_id="call_1", name="go"),
)

HOOK_PAYLOADS: dict[str, schemas.AnyHook] = {
    "task_start": TaskStart(task=TASK, system_prompt="Be brief.", tools=(TOOL,)),
    "step_start": StepStart(step=1, messages=MESSAGES),
    "before_model": BeforeModel(step=1, messages=MESSAGES, tools=(TOOL,)),
    "after_model": AfterModel(step=1, content="go north", tool_calls=(CALL,), stop_reason="tool_use",
                              model="anthropic:claude-sonnet-4-6"),
    "before_tool": BeforeTool(step=1, call=CALL, approved=False),
    "after_tool": AfterTool(step=1, call=CALL, result=RESULT),
    "step_end": StepEnd(step=1, messages=MESSAGES, done=True),
    "task_end": TaskEnd(task_id=TASK.id, passed=True, score=1.0, steps=3, status="completed"),
}

EXAMPLES: list[Event] = [
    RunStarted(run_id="run-1", kind="evolve", config={"rounds": 3, "model": "m", "lr": 1e-4}, seed=7),
    RunFinished(run_id="run-1", status="failed", reason="budget", rounds=2),
    RoundStarted(run_id="run-1", round=2, harness_digest="sha256:ab", task_ids=("a", "b.c"), split="dev",
                 attempts_per_task=4),
    RoundFinished(run_id="run-1", round=2, attempts=8, passed=5),
    AttemptStarted(run_id="run-1", round=2, task_id="a", attempt=3, harness_digest="d", model="m", seed=1),
    AttemptFinished(run_id="run-1", round=2, task_id="a", attempt=3, passed=False, score=0.25, steps=9,
                    status="interrupted", reason="processor interrupted"),
    ModelRequest(role="main", model="anthropic:claude-sonnet-4-6", step=1, messages=MESSAGES, tools=(TOOL,),
                 params={"temperature": 0.7, "max_tokens": 512}, try_index=1),
    ModelResponse(role="main", model="m", model_version="m-2026-01", step=1, content="go north",
                  tool_calls=(CALL,), stop_reason="tool_use",
                  usage=Usage(input_tokens=10, output_tokens=3, cache_read_tokens=2, cost_usd=0.001),
                  logprobs=(TokenLogprob(token="go", logprob=-0.1,
                                         top=(TopLogprob(token="go", logprob=-0.1),
                                              TopLogprob(token="look", logprob=-2.5))),),
                  try_index=0),
    ModelError(role="main", model="m", step=1, kind="rate_limit", message="slow down", try_index=2,
               next_action="retry"),
    ToolInvoked(step=1, call=CALL),
    ToolReturned(step=1, result=RESULT, nondeterministic=True),
    EnvObservation(step=1, observation="You see a coin.", valid_actions=("take coin", "look"), score=0.5,
                   done=True, success=True, failure=False, info={"moves": 4}),
    VerifierScore(verifier="twx", passed=True, score=1.0, reward=1.0, detail="coin taken"),
    ProcessorTriggered(processor="trim_history", group="context", hook="step_start", step=4, action="changed",
                       fields=("messages",), outputs=1, reason="over budget"),
    *[HookRecord(stage=stage, step=1 if name not in ("task_start", "task_end") else 0, index=i,
                 event=HOOK_PAYLOADS[name])
      for i, name in enumerate(HOOK_NAMES) for stage in ("emitted", "returned")],
]


# --- a generic sample for any registered type (covers types added after this file) --------

def _sample(info: msgspec.inspect.Type, depth: int = 0) -> Any:
    ins = msgspec.inspect
    if isinstance(info, ins.StructType):
        kwargs = {f.name: _sample(f.type, depth + 1) for f in info.fields}
        return info.cls(**kwargs)
    if isinstance(info, ins.LiteralType):
        return info.values[-1]
    if isinstance(info, ins.UnionType):
        members = [t for t in info.types if not isinstance(t, ins.NoneType)]
        if depth > 8 and len(members) < len(info.types):
            return None  # a recursive type (a rule's pattern names a text that names a pattern) ends here
        return _sample(members[-1], depth)
    if isinstance(info, ins.BoolType):
        return True
    if isinstance(info, ins.IntType):
        return 42 + depth
    if isinstance(info, ins.FloatType):
        return 0.5
    if isinstance(info, ins.StrType):
        return f"s{depth}.é"
    if isinstance(info, ins.BytesType):
        return b"\x00\x01"
    if isinstance(info, ins.DictType):
        if isinstance(info.value_type, ins.AnyType):
            return {"k": 1, "nested": {"a": [1, "two", None]}}
        return {_sample(info.key_type, depth + 1): _sample(info.value_type, depth + 1)}
    if isinstance(info, ins.VarTupleType):
        return (_sample(info.item_type, depth + 1),)
    if isinstance(info, ins.TupleType):
        return tuple(_sample(t, depth + 1) for t in info.item_types)
    if isinstance(info, ins.ListType | ins.SetType | ins.FrozenSetType):
        return [_sample(info.item_type, depth + 1)]
    if isinstance(info, ins.AnyType):
        return {"any": [1, 2.5, "x"]}
    if isinstance(info, ins.NoneType):
        return None
    raise AssertionError(f"no sample for {info!r}; extend _sample in tests/test_schemas.py")


def generic_sample(cls: type[Event]) -> Event:
    event = _sample(msgspec.inspect.type_info(cls))
    assert isinstance(event, cls)
    return event


# --- round trips -------------------------------------------------------------------------


def test_examples_cover_every_hook_kind() -> None:
    assert set(HOOK_PAYLOADS) == set(HOOK_NAMES) == set(HOOK_EVENT_TYPES)
    for name, payload in HOOK_PAYLOADS.items():
        assert isinstance(payload, HOOK_EVENT_TYPES[name])
    kinds = {type(e.event) for e in EXAMPLES if isinstance(e, HookRecord)}
    assert kinds == set(HOOK_EVENT_TYPES.values())


def test_examples_cover_the_original_vocabulary() -> None:
    covered = {type(e).TYPE for e in EXAMPLES}
    core = {"run.started", "run.finished", "round.started", "round.finished", "attempt.started",
            "attempt.finished", "model.request", "model.response", "model.error", "tool.invoked",
            "tool.returned", "env.observation", "verifier.score", "hook", "processor.triggered"}
    assert core <= set(event_types())
    assert core <= covered


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: f"{type(e).TYPE}")
def test_example_round_trips(event: Event) -> None:
    cls = type(event)
    assert event_type(cls.TYPE) is cls
    body = encode_body(event)
    decoded = decode_body(cls.TYPE, cls.VERSION, body)
    assert type(decoded) is cls
    assert decoded == event
    # the header form of the version (a string) decodes too
    assert decode_body(cls.TYPE, str(cls.VERSION), body) == event
    assert encode_body(decoded) == body


@pytest.mark.parametrize("name", sorted(event_types()))
def test_every_registered_type_round_trips(name: str) -> None:
    cls = event_types()[name]
    assert name == cls.TYPE
    assert isinstance(cls.VERSION, int) and cls.VERSION >= 1
    event = generic_sample(cls)
    body = encode_body(event)
    assert decode_body(name, cls.VERSION, body) == event
    # and through a whole message with headers
    hdrs = headers_for(name, cls.VERSION, "id-1", 123)
    [rec] = decode_message("hx.trace.r.1.t.0", 9, hdrs, body)
    assert rec == Record(9, 0, "hx.trace.r.1.t.0", name, cls.VERSION, 123, event, frame_ns=123)
    assert rec.position == (9, 0)


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_hook_record_keeps_hook_kind(name: str) -> None:
    rec = HookRecord(stage="returned", step=2, index=1, event=HOOK_PAYLOADS[name])
    raw = msgspec.msgpack.decode(encode_body(rec))
    assert raw["event"]["hook"] == name  # the tag travels with the payload
    decoded = decode_body("hook", 1, encode_body(rec))
    assert isinstance(decoded, HookRecord)
    assert type(decoded.event) is HOOK_EVENT_TYPES[name]
    assert decoded == rec


def test_hook_record_with_unknown_hook_tag_is_rejected() -> None:
    raw = msgspec.to_builtins(HookRecord(stage="emitted", step=0, event=HOOK_PAYLOADS["task_end"]))
    raw["event"]["hook"] = "after_lunch"
    with pytest.raises(DecodeError, match="malformed 'hook' body"):
        decode_body("hook", 1, msgspec.msgpack.encode(raw))


def test_frames_round_trip() -> None:
    events = [*EXAMPLES[:5], EXAMPLES[-1]]
    body = encode_frame(events)
    triples = decode_frame(body)
    assert [(t, v) for t, v, _ in triples] == [(type(e).TYPE, type(e).VERSION) for e in events]
    assert [e for _, _, e in triples] == events
    hdrs = headers_for(FRAME_TYPE, 1, "frame-1", 77, count=len(events))
    assert hdrs[HX_COUNT] == str(len(events))
    records = decode_message("hx.trace.r.1.t.0", 5, hdrs, body)
    assert [r.position for r in records] == [(5, i) for i in range(len(events))]
    assert [r.event for r in records] == events
    assert [r.type for r in records] == [type(e).TYPE for e in events]
    assert all(r.time_ns == 77 and r.subject == "hx.trace.r.1.t.0" for r in records)


def test_a_deflated_message_is_inflated_by_decode_message_itself() -> None:
    events = [*EXAMPLES[:5], EXAMPLES[-1]]
    hdrs = {**headers_for(FRAME_TYPE, 1, "frame-1", 77, count=len(events)), HX_ENCODING: DEFLATE}
    records = decode_message("hx.trace.r.1.t.0", 5, hdrs, deflate(encode_frame(events)))
    assert [r.event for r in records] == events
    err = _decode_error({**hdrs, HX_ENCODING: "zstd"}, deflate(encode_frame(events)))
    assert err.reason == "unknown Hx-Encoding 'zstd'"
    assert "corrupt deflate body" in _decode_error(hdrs, b"not deflated").reason


def test_an_older_version_read_alone_or_in_a_frame_reports_the_version_stored() -> None:
    old = msgspec.msgpack.encode({"stage": "emitted", "step": 1, "event": {"hook": "step_start", "step": 1}})
    [alone] = decode_message(SUBJECT, 1, {HX_TYPE: "hook", HX_SCHEMA_VERSION: "1"}, old)
    frame = msgspec.msgpack.encode([("hook", 1, msgspec.Raw(old))])
    [framed] = decode_message(SUBJECT, 2, headers_for(FRAME_TYPE, 1, "f", 0, count=1), frame)
    assert alone.version == framed.version == 1 and alone.event == framed.event


def test_single_event_frame_and_empty_frame() -> None:
    assert [e for _, _, e in decode_frame(encode_frame([EXAMPLES[0]]))] == [EXAMPLES[0]]
    assert decode_frame(encode_frame([])) == []


# --- strict decoding ---------------------------------------------------------------------

SUBJECT = "hx.trace.run-1.2._.3"


def _decode_error(headers: dict[str, str] | None, body: bytes, seq: int = 4242) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode_message(SUBJECT, seq, headers, body)
    err = info.value
    assert isinstance(err, SchemaError) and isinstance(err, HxError)
    assert err.subject == SUBJECT
    assert err.seq == seq
    text = str(err)
    assert SUBJECT in text and "4242" in text
    return err


def test_unknown_type_is_a_decode_error_naming_subject_and_sequence() -> None:
    body = encode_body(EXAMPLES[0])
    err = _decode_error(headers_for("no.such.type", 1, "x", 1), body)
    assert "no.such.type" in err.reason
    with pytest.raises(DecodeError, match="unknown event type"):
        decode_body("no.such.type", 1, body)


@pytest.mark.parametrize("version", ["2", "0", "abc", "", None])
def test_wrong_schema_version_is_a_decode_error(version: str | None) -> None:
    event = EXAMPLES[0]
    headers = {HX_TYPE: type(event).TYPE, HX_TIME: "1", MSG_ID: "x"}
    if version is not None:
        headers[HX_SCHEMA_VERSION] = version
    err = _decode_error(headers, encode_body(event))
    assert "schema version" in err.reason
    with pytest.raises(DecodeError, match="schema version"):
        decode_body(type(event).TYPE, version, encode_body(event))


@pytest.mark.parametrize("body", [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode([1, 2, 3]),
                                  msgspec.msgpack.encode({"run_id": 5})])
def test_malformed_body_is_a_decode_error(body: bytes) -> None:
    err = _decode_error(headers_for("run.started", 1, "x", 1), body)
    assert "malformed 'run.started' body" in err.reason


def test_missing_required_field_is_a_decode_error() -> None:
    body = msgspec.msgpack.encode({"kind": "rollout"})  # run_id is required
    err = _decode_error(headers_for("run.started", 1, "x", 1), body)
    assert "run_id" in err.reason


def test_unknown_field_is_a_decode_error() -> None:
    raw = msgspec.to_builtins(EXAMPLES[0])
    raw["smuggled"] = "extra"
    err = _decode_error(headers_for("run.started", 1, "x", 1), msgspec.msgpack.encode(raw))
    assert "smuggled" in err.reason


def test_unknown_field_in_a_nested_payload_is_a_decode_error() -> None:
    raw = msgspec.to_builtins(ToolInvoked(step=1, call=CALL))
    raw["call"]["extra"] = 1
    err = _decode_error(headers_for("tool.invoked", 1, "x", 1), msgspec.msgpack.encode(raw))
    assert "extra" in err.reason


@pytest.mark.parametrize("headers", [None, {}, {HX_SCHEMA_VERSION: "1", HX_TIME: "1", MSG_ID: "x"}])
def test_missing_type_header_is_a_decode_error(headers: dict[str, str] | None) -> None:
    err = _decode_error(headers, encode_body(EXAMPLES[0]))
    assert HX_TYPE in err.reason


def test_bad_time_header_is_a_decode_error() -> None:
    headers = headers_for("run.started", 1, "x", 1)
    headers[HX_TIME] = "yesterday"
    err = _decode_error(headers, encode_body(EXAMPLES[0]))
    assert HX_TIME in err.reason


def test_missing_time_header_decodes_with_zero_time() -> None:
    [rec] = decode_message(SUBJECT, 1, {HX_TYPE: "run.started", HX_SCHEMA_VERSION: "1"},
                           encode_body(EXAMPLES[0]))
    assert rec.time_ns == 0 and rec.event == EXAMPLES[0]


def test_malformed_frames_are_decode_errors() -> None:
    hdrs = headers_for(FRAME_TYPE, 1, "f", 1, count=1)
    err = _decode_error(hdrs, b"\x93garbage")
    assert "malformed frame" in err.reason
    # a frame holding an unknown type or a wrong version fails as a whole
    good = encode_body(EXAMPLES[0])
    for item, needle in ((["no.such.type", 1, msgspec.Raw(good)], "no.such.type"),
                         (["run.started", 9, msgspec.Raw(good)], "schema version"),
                         (["run.started", 1, msgspec.Raw(b"\xc1")], "malformed")):
        body = msgspec.msgpack.encode([["run.started", 1, msgspec.Raw(good)], item])
        err = _decode_error(hdrs, body)
        assert needle in err.reason
    with pytest.raises(DecodeError):
        decode_frame(b"\x00")


def test_decode_error_without_location() -> None:
    err = DecodeError("boom")
    assert str(err) == "cannot decode message: boom"
    located = err.at(subject="a.b", seq=3)
    assert (located.reason, located.subject, located.seq) == ("boom", "a.b", 3)
    assert "'a.b'" in str(located) and "sequence 3" in str(located)


# --- the registry ------------------------------------------------------------------------


def test_declaring_a_type_twice_is_a_schema_error() -> None:
    before = event_types()
    with pytest.raises(SchemaError, match=r"'run\.started' is declared twice") as info:
        class Impostor(Event, frozen=True, kw_only=True):
            TYPE = "run.started"
            run_id: str
    assert "RunStarted" in str(info.value) and "Impostor" in str(info.value)
    assert event_type("run.started") is RunStarted
    assert event_types() == before
    # registering the same class again is harmless
    assert register(RunStarted) is RunStarted
    assert event_types() == before


def test_unknown_event_type_lookup_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="unknown event type 'nope'"):
        event_type("nope")


def test_event_without_type_cannot_be_encoded_and_is_not_registered() -> None:
    before = event_types()

    class Untyped(Event, frozen=True, kw_only=True):
        x: int = 0

    assert event_types() == before
    with pytest.raises(SchemaError, match="has no TYPE"):
        encode_body(Untyped(x=1))
    with pytest.raises(SchemaError, match="has no TYPE"):
        encode_frame([EXAMPLES[0], Untyped()])


def test_event_types_are_sorted_by_name() -> None:
    names = list(event_types())
    assert names == sorted(names)


# --- immutability and determinism --------------------------------------------------------


@pytest.mark.parametrize("event", EXAMPLES[:14], ids=lambda e: type(e).TYPE)
def test_events_are_frozen(event: Event) -> None:
    name = msgspec.structs.fields(event)[0].name
    with pytest.raises(AttributeError):
        setattr(event, name, getattr(event, name))


def test_payloads_are_frozen_and_changed_with_replace() -> None:
    with pytest.raises(AttributeError):
        CALL.name = "other"  # type: ignore[misc]
    payload = HOOK_PAYLOADS["after_model"]
    assert isinstance(payload, AfterModel)
    with pytest.raises(AttributeError):
        payload.content = "x"  # type: ignore[misc]
    changed = msgspec.structs.replace(payload, content="go south")
    assert changed.content == "go south" and payload.content == "go north"


def test_events_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        RunStarted("run-1")  # type: ignore[call-arg]


def test_equal_events_encode_to_identical_bytes() -> None:
    for event in EXAMPLES:
        clone = msgspec.msgpack.decode(msgspec.msgpack.encode(event), type=type(event))
        assert clone == event and clone is not event
        assert encode_body(clone) == encode_body(event)


def test_dict_order_does_not_change_the_body() -> None:
    a = RunStarted(run_id="r", config={"alpha": 1, "beta": {"x": 1, "y": 2}, "gamma": [3]})
    b = RunStarted(run_id="r", config={"gamma": [3], "beta": {"y": 2, "x": 1}, "alpha": 1})
    assert a == b
    assert encode_body(a) == encode_body(b)
    call_a = ToolInvoked(step=1, call=ToolCall(id="c", name="n", input={"a": 1, "b": 2}))
    call_b = ToolInvoked(step=1, call=ToolCall(id="c", name="n", input={"b": 2, "a": 1}))
    assert encode_body(call_a) == encode_body(call_b)
    assert encode_frame([a, call_a]) == encode_frame([b, call_b])


def test_wall_clock_time_is_only_in_headers() -> None:
    event = EXAMPLES[0]
    first = encode_body(event)
    t0 = time.time_ns()
    while time.time_ns() == t0:  # make sure the clock moved
        pass
    assert encode_body(event) == first
    raw = msgspec.msgpack.decode(first)
    assert isinstance(raw, dict)
    assert set(raw) == {f.name for f in msgspec.structs.fields(event)}
    assert not any("time" in key for key in raw)
    for struct in (RunStarted, HookRecord, ModelResponse, AttemptFinished):
        assert not any("time" in f for f in struct.__struct_fields__)
    # the time travels in the Hx-Time header instead
    h1 = headers_for("run.started", 1, "id", 111)
    h2 = headers_for("run.started", 1, "id", 222)
    assert h1[HX_TIME] == "111" and h2[HX_TIME] == "222"
    assert h1 == {HX_TYPE: "run.started", HX_SCHEMA_VERSION: "1", HX_TIME: "111", MSG_ID: "id"}
    [r1] = decode_message(SUBJECT, 1, h1, first)
    [r2] = decode_message(SUBJECT, 2, h2, first)
    assert r1.event == r2.event and (r1.time_ns, r2.time_ns) == (111, 222)


def test_hook_names_literal_matches_tuple() -> None:
    assert set(typing.get_args(schemas.HookName)) == set(HOOK_NAMES)
    assert len(HOOK_NAMES) == 8
