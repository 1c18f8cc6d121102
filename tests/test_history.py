"""Conversations logged as deltas: diff and apply, the packer and the resolver, old versions."""

from __future__ import annotations

import random

import msgspec
import pytest

from schemas.envelope import Record, decode_body, encode_body
from schemas.errors import DecodeError, HistoryGap
from schemas.event import Event
from schemas.history import HistoryPacker, HistoryResolver, apply, conversation, diff, packed, resolve
from schemas.hooks import AfterModel, BeforeModel, HookRecord, StepEnd, StepStart
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import History, Message
from schemas.model import ModelRequest

SUBJECT = "hx.trace.r.0.t.0"


def msg(i: int, role: str = "user") -> Message:
    return Message(role=role, content=f"message {i}")  # type: ignore[arg-type]


def test_diff_then_apply_rebuilds_every_edit_a_harness_makes() -> None:
    rng = random.Random(5)
    for trial in range(500):
        base = tuple(msg(rng.randrange(8)) for _ in range(rng.randrange(12)))
        new = list(base)
        edit = trial % 6
        if edit == 0:  # append
            new += [msg(100 + k) for k in range(rng.randrange(1, 4))]
        elif edit == 1 and len(new) > 2:  # window: keep the first, drop a middle run
            cut = rng.randrange(1, len(new))
            new = new[:1] + new[cut:]
        elif edit == 2 and new:  # edit the last message (a copy, not the same object)
            new[-1] = Message(role="user", content=new[-1].content + " (note)")
        elif edit == 3:  # reorder
            rng.shuffle(new)
        elif edit == 4:  # copies equal by value, not by identity
            new = [msgspec.msgpack.decode(msgspec.msgpack.encode(m), type=Message) for m in new]
        else:  # a conversation that has nothing to do with the last one
            new = [msg(200 + k, "assistant") for k in range(rng.randrange(5))]
        parts = diff(base, new)
        assert apply(base, parts) == tuple(new), (trial, base, new, parts)


def test_a_growing_conversation_is_one_span_and_the_new_messages() -> None:
    base = (msg(0, "system"), msg(1), msg(2, "assistant"))
    new = (*base, msg(3, "tool"), msg(4))
    assert diff(base, new) == ((0, 3), msg(3, "tool"), msg(4))
    window = (base[0], *new[2:])
    assert diff(new, window) == ((0, 1), (2, 5))
    assert diff((), base) == base


def test_a_span_outside_the_base_is_a_gap() -> None:
    with pytest.raises(HistoryGap, match=r"span \[1, 4\) lies outside the previous conversation of 2 messages"):
        apply((msg(0), msg(1)), [(1, 4)])


def events_of_an_attempt() -> list[Event]:
    """A step's conversation-bearing events as the run loop emits them (and one without a conversation)."""
    sys, first = msg(0, "system"), msg(1)
    h1 = (sys, first)
    h2 = (*h1, msg(2, "assistant"), msg(3, "tool"))
    trimmed = (sys, *h2[2:])
    edited = (*trimmed[:-1], Message(role="tool", content="message 3, with a note"))
    return [
        AttemptStarted(run_id="r", round=0, task_id="t", attempt=0, harness_digest="d", model="m"),
        HookRecord(stage="emitted", step=1, event=StepStart(step=1, messages=h1)),
        HookRecord(stage="returned", step=1, event=StepStart(step=1, messages=h1)),
        HookRecord(stage="emitted", step=1, event=BeforeModel(step=1, messages=h1)),
        ModelRequest(role="main", model="m", step=1, messages=h1),
        HookRecord(stage="emitted", step=1, event=AfterModel(step=1, content="hi")),
        HookRecord(stage="emitted", step=1, event=StepEnd(step=1, messages=h2)),
        HookRecord(stage="emitted", step=2, event=StepStart(step=2, messages=h2)),
        HookRecord(stage="returned", step=2, event=StepStart(step=2, messages=trimmed)),
        HookRecord(stage="returned", step=2, event=BeforeModel(step=2, messages=edited, route="judge")),
        ModelRequest(role="judge", model="m", step=2, messages=edited, params={"temperature": 0.0}),
        AttemptFinished(run_id="r", round=0, task_id="t", attempt=0, passed=True),
    ]


def log_records(events: list[Event], subject: str = SUBJECT, first_seq: int = 1) -> list[Record]:
    """The events packed by the tracer's packer, encoded and decoded as the log stores them."""
    packer = HistoryPacker()
    out = []
    for i, event in enumerate(events):
        wire = packer.pack(event)
        cls = type(wire)
        decoded = decode_body(cls.TYPE, cls.VERSION, encode_body(wire))
        out.append(Record(first_seq + i // 4, i % 4, subject, cls.TYPE, cls.VERSION, 0, decoded))
    return out


def test_the_log_holds_deltas_and_the_resolver_gives_back_every_event_in_full() -> None:
    events = events_of_an_attempt()
    records = log_records(events)
    with_history = [r.event for r in records if packed(r.event) is not None]
    assert len(with_history) == 9
    assert all(conversation(e) == () for e in with_history)  # on the log, messages live in the delta only
    assert [packed(e).ordinal for e in with_history] == list(range(9))  # type: ignore[union-attr]
    stored = sum(len(encode_body(r.event)) for r in records)
    assert stored < sum(len(encode_body(e)) for e in events)
    assert [r.event for r in resolve(records)] == events


def test_attempts_interleaved_on_a_read_resolve_apart() -> None:
    a = log_records(events_of_an_attempt(), "hx.trace.r.0.a.0")
    b = log_records(events_of_an_attempt()[:6], "hx.trace.r.0.b.0")
    mixed = [r for pair in zip(a, b, strict=False) for r in pair] + a[len(b):]
    resolved = list(resolve(mixed))
    assert [r.event for r in resolved if r.subject.endswith(".a.0")] == events_of_an_attempt()
    assert [r.event for r in resolved if r.subject.endswith(".b.0")] == events_of_an_attempt()[:6]


def test_a_read_that_starts_mid_attempt_is_a_gap_naming_the_record() -> None:
    records = log_records(events_of_an_attempt(), first_seq=40)
    with pytest.raises(HistoryGap) as err:
        list(resolve(records[5:]))
    text = str(err.value)
    assert "hook at subject 'hx.trace.r.0.t.0', sequence 41 (frame index 2)" in text
    assert "conversation 4 is a delta against conversation 3 of its attempt, which was not read" in text
    lenient = list(resolve(records[5:], strict=False))  # lenient: passed on as stored
    assert [r.event for r in lenient] == [r.event for r in records[5:]]


def test_a_filtered_read_is_a_gap_not_a_wrong_conversation() -> None:
    requests = [r for r in log_records(events_of_an_attempt()) if r.type == "model.request"]
    with pytest.raises(HistoryGap, match="conversation 3 is a delta against conversation 2"):
        list(resolve(requests))


def test_an_attempt_rerun_on_its_subject_starts_over() -> None:
    records = log_records(events_of_an_attempt())
    again = log_records(events_of_an_attempt(), first_seq=100)
    assert [r.event for r in resolve(records[:7] + again)] == events_of_an_attempt()[:7] + events_of_an_attempt()


def test_the_resolver_forgets_a_finished_attempt() -> None:
    resolver = HistoryResolver()
    for record in log_records(events_of_an_attempt()):
        resolver.resolve(record)
    assert not resolver._last


def test_events_written_before_deltas_existed_still_decode() -> None:
    old = {"stage": "emitted", "step": 1, "index": 0,
           "event": {"hook": "step_start", "step": 1, "messages": [{"role": "user", "content": "hi"}]}}
    record = decode_body("hook", 1, msgspec.msgpack.encode(old))
    hi = Message(role="user", content="hi")
    assert record == HookRecord(stage="emitted", step=1, event=StepStart(step=1, messages=(hi,)))
    assert packed(record) is None
    request = decode_body("model.request", "1", msgspec.msgpack.encode({"role": "main", "model": "m", "step": 1}))
    assert isinstance(request, ModelRequest) and request.history is None
    assert decode_body("hook", 2, msgspec.msgpack.encode(old)) == record  # version 2 lacks the `offered` fields
    with pytest.raises(DecodeError, match="event type 'hook' has schema version 4; this hx reads 3"):
        decode_body("hook", 4, msgspec.msgpack.encode(old))


def test_a_packed_event_is_not_packed_twice() -> None:
    packer = HistoryPacker()
    once = packer.pack(ModelRequest(role="main", model="m", step=1, messages=(msg(0),)))
    assert packer.pack(once) is once
    assert once.history == History(ordinal=0, parts=(msg(0),))  # type: ignore[attr-defined]
