"""The stream topology: created once, idempotent, immutable ledger, mismatches refused; subjects."""

from __future__ import annotations

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from schemas.errors import HxError
from streams.errors import LogError, TopologyMismatch
from streams.integrity import HEADS_BUCKET
from streams.topology import (
    BLOB_STORE,
    DUPLICATE_WINDOW_S,
    LEARN,
    LEDGER,
    NO_TOKEN,
    POSITIONS_BUCKET,
    SPECS,
    STREAMS,
    TRACE,
    TraceAddress,
    apply_topology,
    subject_token,
    token_value,
    trace_filter,
    trace_subject,
)


async def stream_names(js: JetStreamContext) -> set[str]:
    return {info.config.name for info in await js.streams_info() if info.config.name is not None}


# --- apply_topology ----------------------------------------------------------------------


async def test_apply_creates_streams_and_buckets(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    assert await stream_names(js) == set()
    await apply_topology(js)
    names = await stream_names(js)
    assert {"HX_TRACE", "HX_LEDGER", "HX_LEARN"} <= names
    assert set(SPECS) == {"HX_TRACE", "HX_LEDGER", "HX_LEARN"}

    for spec in STREAMS:
        cfg = (await js.stream_info(spec.name)).config
        assert cfg.subjects == list(spec.subjects)
        assert cfg.storage == "file" and cfg.retention == "limits"
        assert cfg.duplicate_window == DUPLICATE_WINDOW_S
        assert cfg.allow_atomic is True
        assert cfg.max_age == 0.0
        assert spec.differences(cfg) == []
    assert (await js.stream_info("HX_TRACE")).config.subjects == ["hx.trace.>"]
    assert (await js.stream_info("HX_LEARN")).config.subjects == ["hx.learn.>"]
    ledger = (await js.stream_info("HX_LEDGER")).config
    assert ledger.deny_delete is True and ledger.deny_purge is True
    trace = (await js.stream_info("HX_TRACE")).config
    assert trace.deny_delete is False and trace.deny_purge is False

    # the KV bucket for projection positions works
    kv = await js.key_value(POSITIONS_BUCKET)
    rev = await kv.put("trace_store", b"17")
    assert (await kv.get("trace_store")).value == b"17"
    assert await kv.update("trace_store", b"18", last=rev) > rev

    # the object store for blobs works
    store = await js.object_store(BLOB_STORE)
    await store.put("sha256:abc", b"processor source " * 1000)
    assert (await store.get("sha256:abc")).data == b"processor source " * 1000


async def test_each_stream_captures_its_subjects(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    await apply_topology(js)
    for subject, stream in (("hx.trace.r._._._", "HX_TRACE"), ("hx.ledger.edits", "HX_LEDGER"),
                            ("hx.learn.updates", "HX_LEARN")):
        ack = await js.publish(subject, b"x")
        assert ack.stream == stream


async def test_ledger_refuses_delete_and_purge(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    await apply_topology(js)
    acks = [await js.publish("hx.ledger.edits", f"edit {i}".encode()) for i in range(3)]
    with pytest.raises(nats.js.errors.APIError) as info:
        await js.delete_msg(LEDGER.name, acks[1].seq)
    assert "not permitted" in (info.value.description or "")
    with pytest.raises(nats.js.errors.APIError) as info:
        await js.purge_stream(LEDGER.name)
    assert "not permitted" in (info.value.description or "")
    state = (await js.stream_info(LEDGER.name)).state
    assert (state.messages, state.first_seq, state.last_seq) == (3, 1, 3)
    assert (await js.get_msg(LEDGER.name, acks[1].seq)).data == b"edit 1"
    # the trace stream is not protected that way (contrast)
    ack = await js.publish("hx.trace.r._._._", b"x")
    assert await js.delete_msg(TRACE.name, ack.seq)


async def test_apply_twice_is_idempotent(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    await apply_topology(js)
    await js.publish("hx.trace.r._._._", b"kept")
    kv = await js.key_value(POSITIONS_BUCKET)
    await kv.put("p", b"1")
    store = await js.object_store(BLOB_STORE)
    await store.put("blob", b"data")
    before = {name: (await js.stream_info(name)) for name in await stream_names(js)}

    await apply_topology(js)
    await apply_topology(js)

    after = {name: (await js.stream_info(name)) for name in await stream_names(js)}
    assert set(after) == set(before)
    for name, info in after.items():
        assert info.config == before[name].config, name
        assert info.created == before[name].created, name  # not recreated
        if name != f"KV_{HEADS_BUCKET}":  # heads move forward with the streams they describe
            assert info.state.messages == before[name].state.messages, name
    assert (await js.get_msg(TRACE.name, 1)).data == b"kept"
    assert (await (await js.key_value(POSITIONS_BUCKET)).get("p")).value == b"1"
    assert (await (await js.object_store(BLOB_STORE)).get("blob")).data == b"data"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"subjects": ["hx.trace.>", "elsewhere.>"]}, "subjects"),
        ({"max_age": 3600.0}, "max_age"),
        ({"duplicate_window": 5.0}, "duplicate_window"),
        ({"storage": "memory"}, "storage"),
        ({"deny_delete": True}, "deny_delete"),
    ],
)
async def test_mismatched_trace_stream_is_refused_and_left_alone(
    client: tuple[NATS, JetStreamContext], changes: dict[str, object], field: str
) -> None:
    _, js = client
    cfg = TRACE.config()
    for key, value in changes.items():
        setattr(cfg, key, value)
    await js.add_stream(cfg)
    await js.publish("hx.trace.r._._._", b"existing")
    before = await js.stream_info(TRACE.name)

    with pytest.raises(TopologyMismatch) as info:
        await apply_topology(js)
    err = info.value
    assert isinstance(err, LogError) and isinstance(err, HxError)
    assert "HX_TRACE" in str(err)
    assert f"{field}:" in str(err)
    assert "declared" in str(err) and "found" in str(err)

    after = await js.stream_info(TRACE.name)
    assert after.config == before.config
    assert after.created == before.created
    assert after.state.messages == 1
    for key, value in changes.items():
        assert getattr(after.config, key) == value


async def test_mismatched_ledger_is_named(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    cfg = LEDGER.config()
    cfg.deny_purge = False
    await js.add_stream(cfg)
    with pytest.raises(TopologyMismatch, match=r"HX_LEDGER.*deny_purge: declared True, found False"):
        await apply_topology(js)
    assert (await js.stream_info(LEDGER.name)).config.deny_purge is False


async def test_stream_differences_lists_every_field() -> None:
    cfg = StreamConfig(name="HX_LEARN", subjects=["x.>"], max_age=10.0, duplicate_window=1.0,
                       deny_delete=True, deny_purge=True, storage=StorageType.MEMORY,
                       retention=RetentionPolicy.WORK_QUEUE)
    diffs = LEARN.differences(cfg)
    assert {d.split(":", 1)[0] for d in diffs} == {"subjects", "deny_delete", "deny_purge", "max_age",
                                                    "duplicate_window", "storage", "retention"}
    assert LEARN.differences(LEARN.config()) == []


# --- subjects ----------------------------------------------------------------------------

AWKWARD = [
    "plain",
    "twx:coin:dev:17",
    "a.b.c",
    "with space",
    "*",
    ">",
    "a*b>c",
    "_",
    "__",
    "_x",
    "%",
    "%2E",
    "100%",
    "ünïcødé-タスク",
    "tab\there",
    "new\nline",
    "slash/and\\back",
    "emoji 🪙",
    "-",
    "0",
]


def _is_valid_token(token: str) -> bool:
    return bool(token) and token.isascii() and not any(c in token for c in ".*> \t\r\n") and token.isprintable()


@pytest.mark.parametrize("value", AWKWARD)
def test_subject_token_round_trips(value: str) -> None:
    token = subject_token(value)
    assert _is_valid_token(token), token
    assert token_value(token) == value
    assert token != NO_TOKEN


def test_subject_tokens_are_injective_and_plain_values_stay_readable() -> None:
    tokens = [subject_token(v) for v in AWKWARD]
    assert len(set(tokens)) == len(AWKWARD)
    assert subject_token("twx:coin:dev:17") == "twx:coin:dev:17"
    assert subject_token(42) == "42"
    assert subject_token("_") == "%5F"
    assert subject_token("a.b") == "a%2Eb"
    with pytest.raises(ValueError, match="empty"):
        subject_token("")


@pytest.mark.parametrize("task", AWKWARD)
def test_trace_address_round_trips(task: str) -> None:
    addr = TraceAddress(run=f"run {task}", round=3, task=task, attempt=0)
    subject = addr.subject
    assert subject.startswith("hx.trace.")
    assert len(subject.split(".")) == 6
    assert all(_is_valid_token(t) for t in subject.split("."))
    assert TraceAddress.parse(subject) == addr
    assert trace_subject(addr.run, 3, task, 0) == subject


def test_trace_address_placeholders() -> None:
    run_level = TraceAddress("r1")
    assert run_level.subject == "hx.trace.r1._._._"
    assert TraceAddress.parse(run_level.subject) == run_level
    round_level = TraceAddress("r1", 2)
    assert round_level.subject == "hx.trace.r1.2._._"
    assert TraceAddress.parse(round_level.subject) == round_level
    # a task literally named "_" is not the placeholder
    odd = TraceAddress("_", 0, "_", 0)
    assert odd.subject == "hx.trace.%5F.0.%5F.0"
    assert TraceAddress.parse(odd.subject) == odd


@pytest.mark.parametrize("subject", ["hx.trace.r.1.t", "hx.trace.r.1.t.0.Extra", "hx.trace.r.1._._.started",
                                     "hx.trace.r.1.t.0.s.x", "hx.ledger.r.1.t.0",
                                     "other.trace.r.1.t.0", "hx.trace.r.one.t.0", "hx.trace.r.1.t.zero", ""])
def test_parse_rejects_non_trace_subjects(subject: str) -> None:
    with pytest.raises(ValueError) as info:
        TraceAddress.parse(subject)
    assert repr(subject) in str(info.value)


def test_trace_filter_wildcards() -> None:
    assert trace_filter() == "hx.trace.*.*.*.*"
    assert trace_filter(run="r1") == "hx.trace.r1.*.*.*"
    assert trace_filter(run="r1", round=2) == "hx.trace.r1.2.*.*"
    assert trace_filter(task="a.b") == "hx.trace.*.*.a%2Eb.*"
    assert trace_filter(attempt=0) == "hx.trace.*.*.*.0"
    assert trace_filter("r", 1, "t", 2) == trace_subject("r", 1, "t", 2)
    # a task literally named "*" is escaped, never a wildcard
    assert trace_filter(task="*") == "hx.trace.*.*.%2A.*"


async def test_awkward_subjects_and_filters_on_a_real_server(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    await apply_topology(js)
    tasks = ["a.b", "*", ">", "_", "with space", "ünï"]
    for rnd in (1, 2):
        for task in tasks:
            for attempt in (0, 1):
                ack = await js.publish(trace_subject("run.1", rnd, task, attempt),
                                       f"{rnd}|{task}|{attempt}".encode())
                assert ack.stream == TRACE.name
    await js.publish(trace_subject("run.1"), b"run-level")
    await js.publish(trace_subject("other", 1, "a.b", 0), b"other run")

    async def matching(filter_subject: str) -> list[bytes]:
        sub = await js.pull_subscribe(filter_subject, stream=TRACE.name)
        info = await sub.consumer_info()
        msgs = await sub.fetch(info.num_pending) if info.num_pending else []
        await sub.unsubscribe()
        return [m.data for m in msgs]

    assert len(await matching(trace_filter())) == 2 * len(tasks) * 2 + 2
    assert len(await matching(trace_filter(run="run.1"))) == 2 * len(tasks) * 2 + 1
    assert await matching(trace_filter(run="run.1", round=2, task="*")) == [b"2|*|0", b"2|*|1"]
    assert await matching(trace_filter(run="run.1", task=">", attempt=1)) == [b"1|>|1", b"2|>|1"]
    assert await matching(trace_filter(task="_", round=1, attempt=0)) == [b"1|_|0"]
    assert await matching(trace_filter(task="a.b", attempt=0)) == [b"1|a.b|0", b"2|a.b|0", b"other run"]
    assert await matching(trace_filter(run="run.1", round=1, task="with space", attempt=1)) == [
        b"1|with space|1"]
    assert await matching(trace_subject("run.1")) == [b"run-level"]
    assert await matching(trace_filter(run="nobody")) == []
