"""The stream topology, declared in one place and applied idempotently at start.

``HX_TRACE`` holds every attempt's events on ``hx.trace.<run>.<round>.<task>.<attempt>``;
``HX_LEDGER`` is the immutable edit ledger (no delete, no purge, no age limit);
``HX_LEARN`` holds learner records. Blobs go to an object store addressed by sha256,
projection positions to a KV bucket, stream heads to another (``streams.integrity``). A
stream that exists with a setting that could lose or refuse events is reported, never
silently changed; one that already lost events is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from nats.js import JetStreamContext
from nats.js.api import (
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import NotFoundError

from streams.errors import InvalidRunId, TopologyMismatch, TopologyMissing
from streams.integrity import HEADS_BUCKET, Heads
from streams.layout import mark_layout

DUPLICATE_WINDOW_S = 120.0


def _unlimited(value: Any) -> bool:
    return value is None or value <= 0


@dataclass(frozen=True)
class Setting:
    """One stream setting that can lose or refuse events: how to read it and why it matters."""

    name: str
    risk: str
    """What a wrong value does to the log."""


LOSS_SETTINGS: tuple[Setting, ...] = (
    Setting("retention", "interest and work-queue retention delete events once consumed"),
    Setting("storage", "memory storage loses every event when the server stops"),
    Setting("max_msgs", "the oldest events are evicted beyond this many"),
    Setting("max_bytes", "the oldest events are evicted beyond this size"),
    Setting("max_age", "events older than this are evicted"),
    Setting("max_msgs_per_subject", "a subject's oldest events are evicted beyond this many"),
    Setting("max_msg_size", "larger events are refused"),
    Setting("discard", "a full stream refuses new events"),
    Setting("no_ack", "appends are not acknowledged, so a lost one goes unnoticed"),
    Setting("sealed", "the stream accepts no more events"),
    Setting("allow_rollup_hdrs", "a rollup header purges a subject's earlier events"),
    Setting("allow_msg_ttl", "events may carry their own expiry"),
    Setting("subject_delete_marker_ttl", "expired subjects leave delete markers"),
    Setting("mirror", "a mirror takes no appends and copies another stream"),
    Setting("sources", "events from other streams mix into this one"),
    Setting("subject_transform", "events are stored under other subjects"),
    Setting("persist_mode", "acknowledged events may be lost in a crash (asynchronous persistence)"),
    Setting("deny_delete", "single events can be deleted"),
    Setting("deny_purge", "the stream can be purged"),
    Setting("duplicate_window", "a retried append is deduplicated only within this window"),
    Setting("subjects", "events land in another stream or nowhere"),
)
"""Every stream setting hx checks on an existing stream, in the order differences are reported."""


@dataclass(frozen=True)
class StreamSpec:
    """A stream hx relies on and the settings it must have."""

    name: str
    subjects: tuple[str, ...]
    description: str
    deny_delete: bool = False
    deny_purge: bool = False
    max_age_s: float = 0.0
    duplicate_window_s: float = DUPLICATE_WINDOW_S
    allow_atomic: bool = True

    def config(self) -> StreamConfig:
        """The nats-py configuration that creates this stream."""
        return StreamConfig(
            name=self.name, subjects=list(self.subjects), description=self.description,
            retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
            max_age=self.max_age_s, duplicate_window=self.duplicate_window_s,
            deny_delete=self.deny_delete, deny_purge=self.deny_purge,
            allow_atomic=self.allow_atomic, allow_direct=True,
        )

    def declared(self) -> dict[str, Any]:
        """The value each checked setting must have (normalised as ``found`` normalises it)."""
        return {
            "retention": "limits", "storage": "file", "max_msgs": "unlimited", "max_bytes": "unlimited",
            "max_age": "unlimited" if _unlimited(self.max_age_s) else float(self.max_age_s),
            "max_msgs_per_subject": "unlimited", "max_msg_size": "unlimited", "discard": "old", "no_ack": False,
            "sealed": False, "allow_rollup_hdrs": False, "allow_msg_ttl": False, "subject_delete_marker_ttl": None,
            "mirror": None, "sources": None, "subject_transform": None, "persist_mode": "default",
            "deny_delete": self.deny_delete, "deny_purge": self.deny_purge,
            "duplicate_window": float(self.duplicate_window_s), "subjects": sorted(self.subjects),
        }

    def differences(self, actual: StreamConfig) -> list[str]:
        """Each checked setting of an existing stream that differs from this spec, with what it risks."""
        want = self.declared()
        have = found(actual)
        return [f"{s.name}: declared {want[s.name]!r}, found {have[s.name]!r} ({s.risk})"
                for s in LOSS_SETTINGS if want[s.name] != have[s.name]]


def _name(value: Any) -> Any:
    return getattr(value, "value", value)  # an enum member, or already its value


def found(cfg: StreamConfig) -> dict[str, Any]:
    """The checked settings of a stream configuration, normalised (limits of 0 or -1 read ``unlimited``)."""
    def limit(value: Any) -> Any:
        return "unlimited" if _unlimited(value) else value
    return {
        "retention": _name(cfg.retention) or "limits", "storage": _name(cfg.storage) or "file",
        "max_msgs": limit(cfg.max_msgs), "max_bytes": limit(cfg.max_bytes),
        "max_age": "unlimited" if _unlimited(cfg.max_age) else float(cfg.max_age or 0.0),
        "max_msgs_per_subject": limit(cfg.max_msgs_per_subject), "max_msg_size": limit(cfg.max_msg_size),
        "discard": _name(cfg.discard) or "old", "no_ack": bool(cfg.no_ack), "sealed": bool(cfg.sealed),
        "allow_rollup_hdrs": bool(cfg.allow_rollup_hdrs), "allow_msg_ttl": bool(cfg.allow_msg_ttl),
        "subject_delete_marker_ttl": cfg.subject_delete_marker_ttl or None,
        "mirror": cfg.mirror or None, "sources": cfg.sources or None, "subject_transform": cfg.subject_transform,
        "persist_mode": _name(cfg.persist_mode) or "default", "deny_delete": bool(cfg.deny_delete),
        "deny_purge": bool(cfg.deny_purge), "duplicate_window": float(cfg.duplicate_window or 0.0),
        "subjects": sorted(cfg.subjects or []),
    }


BUCKET_SETTINGS = ("retention", "storage", "max_msgs", "max_bytes", "max_age", "no_ack", "sealed", "mirror",
                   "sources", "subject_transform", "persist_mode")
"""The settings checked on the streams behind hx's KV buckets and object store (which need rollups and deletes)."""


def bucket_differences(stream: str, actual: StreamConfig) -> list[str]:
    """Settings of a bucket's stream that could lose its entries."""
    have = found(actual)
    want = {"retention": "limits", "storage": "file", "max_msgs": "unlimited", "max_bytes": "unlimited",
            "max_age": "unlimited", "no_ack": False, "sealed": False, "mirror": None, "sources": None,
            "subject_transform": None, "persist_mode": "default"}
    risks = {s.name: s.risk for s in LOSS_SETTINGS}
    return [f"{name}: declared {want[name]!r}, found {have[name]!r} ({risks[name]})"
            for name in BUCKET_SETTINGS if want[name] != have[name]]


TRACE = StreamSpec("HX_TRACE", ("hx.trace.>",), "hook events, model and tool calls, scores of every attempt")
LEDGER = StreamSpec("HX_LEDGER", ("hx.ledger.>",), "the immutable edit ledger: candidates, verdicts, ships",
                    deny_delete=True, deny_purge=True)
LEARN = StreamSpec("HX_LEARN", ("hx.learn.>",), "learner records: policy updates, checkpoints")
STREAMS: tuple[StreamSpec, ...] = (TRACE, LEDGER, LEARN)
BLOB_STORE = "hx_blobs"
POSITIONS_BUCKET = "hx_positions"
SPECS = {spec.name: spec for spec in STREAMS}


def stream_of(subject: str) -> str | None:
    """The hx stream that captures ``subject`` (None: no hx stream does)."""
    return next((spec.name for spec in STREAMS if any(subject.startswith(p.rstrip(">")) for p in spec.subjects)),
                None)


async def stream_infos(js: JetStreamContext, names: Iterable[str]) -> dict[str, StreamInfo | None]:
    """The current info of each named stream (None: it does not exist)."""
    out: dict[str, StreamInfo | None] = {}
    for name in names:
        try:
            out[name] = await js.stream_info(name)
        except NotFoundError:
            out[name] = None
    return out


async def _checked_streams(js: JetStreamContext, heads: Heads) -> dict[str, StreamInfo | None]:
    """Each stream's info, after refusing settings that could lose events and streams that lost some."""
    infos = await stream_infos(js, SPECS)
    mismatches = [f"stream {name} exists with another configuration: " + "; ".join(diffs)
                  for name, info in infos.items() if info is not None
                  and (diffs := SPECS[name].differences(info.config))]
    if mismatches:
        raise TopologyMismatch(". ".join(mismatches))
    await heads.verify(infos)
    return infos


async def check_topology(js: JetStreamContext, heads: Heads) -> None:
    """What ``apply_topology`` checks, read only (an auditor's connection): the streams' settings and heads.

    Raises ``TopologyMismatch`` or ``StreamLoss`` as ``apply_topology`` would, and
    ``TopologyMissing`` when a stream was never made (nothing was recorded on this server).
    """
    infos = await _checked_streams(js, heads)
    missing = [name for name, info in infos.items() if info is None]
    if missing:
        what = f"stream {missing[0]} does" if len(missing) == 1 else f"streams {', '.join(missing)} do"
        raise TopologyMissing(f"{what} not exist on this server: nothing was recorded here yet (an hx command "
                              "that writes, such as hx run or hx evolve, creates them)")


async def apply_topology(js: JetStreamContext, heads: Heads | None = None) -> None:
    """Check every stream and bucket hx relies on, create the missing ones, and record the heads.

    Refuses, changing nothing, a stream whose settings could lose or refuse events
    (``TopologyMismatch`` naming each setting) and one that lost events, vanished or was
    replaced since hx last saw it (``StreamLoss``): a deleted ledger is never recreated
    empty without ``hx log accept-loss``. It never updates an existing stream (the writer
    may not: ``streams.permissions``).
    """
    heads = heads or Heads(js)
    infos = await _checked_streams(js, heads)
    fresh = {name for name, info in infos.items() if info is None}
    for name in fresh:
        infos[name] = await js.add_stream(SPECS[name].config())
    try:
        await js.key_value(POSITIONS_BUCKET)
    except NotFoundError:
        await js.create_key_value(KeyValueConfig(bucket=POSITIONS_BUCKET, history=1,
                                                 storage=StorageType.FILE))
    try:
        await js.object_store(BLOB_STORE)
    except NotFoundError:
        await js.create_object_store(BLOB_STORE, ObjectStoreConfig(storage=StorageType.FILE))
    await heads.bucket()
    buckets = await stream_infos(js, [f"KV_{POSITIONS_BUCKET}", f"KV_{HEADS_BUCKET}", f"OBJ_{BLOB_STORE}"])
    wrong = [f"stream {name} exists with another configuration: " + "; ".join(diffs)
             for name, info in buckets.items() if info is not None and (diffs := bucket_differences(name, info.config))]
    if wrong:
        raise TopologyMismatch(". ".join(wrong))
    await heads.record(info for info in infos.values() if info is not None)
    trace = infos[TRACE.name]
    if trace is not None:
        await mark_layout(js, trace, fresh=TRACE.name in fresh)


# --- subjects ---------------------------------------------------------------------------

NO_TOKEN = "_"
"""Placeholder token for run- and round-level events on trace subjects."""
_UNSAFE = re.compile(r"[^A-Za-z0-9:@,+=~_\-]")


def subject_token(value: str | int) -> str:
    """Encode a value as one NATS subject token (dots, spaces, wildcards percent-escaped)."""
    text = str(value)
    if not text:
        raise ValueError("an empty string cannot be a subject token")
    if text == NO_TOKEN:
        return "%5F"
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), text)


def token_value(token: str) -> str:
    """Decode a token made by ``subject_token``."""
    return unquote(token) if "%" in token else token


RUN_ID_MAX = 128
"""Longest run id: it names subjects, consumer filters and files (``<run>.json`` must fit a file name)."""
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a valid run id, else raise ``InvalidRunId`` (a ``ValueError``) saying what is wrong.

    A run id starts with a letter or digit and holds only letters, digits, ``.``, ``_`` and
    ``-``, at most ``RUN_ID_MAX`` characters: it is used as a subject token and as a file
    name, so it can never climb out of a directory or overflow a protocol line.

    >>> check_run_id("run-20261123T181323Z-7da887")
    'run-20261123T181323Z-7da887'
    """
    if not isinstance(run_id, str) or not run_id:
        raise InvalidRunId("a run id cannot be empty")
    if len(run_id) > RUN_ID_MAX:
        raise InvalidRunId(f"run id is {len(run_id)} characters long; at most {RUN_ID_MAX} are allowed")
    if not _RUN_ID.fullmatch(run_id):
        bad = sorted({c for c in run_id if not (c.isascii() and (c.isalnum() or c in "._-"))})
        what = f"characters {''.join(bad)!r}" if bad else "a first character other than a letter or digit"
        raise InvalidRunId(f"run id {run_id[:40]!r} has {what}; use letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit")
    return run_id


@dataclass(frozen=True)
class TraceAddress:
    """The run, round, task and attempt a trace subject names (None where a placeholder), and its channel.

    An attempt's bulk events are on ``hx.trace.<run>.<round>.<task>.<attempt>``; its few summary
    events (``Event.CHANNEL``) each on that subject plus one token, the channel
    (``....<attempt>.finished``), so a reader of only those has the server filter out the bulk.
    """

    run: str
    round: int | None = None
    task: str | None = None
    attempt: int | None = None
    channel: str | None = None
    """The summary channel (``started``, ``score``, ``finished``), or None for the attempt's bulk subject."""

    @property
    def subject(self) -> str:
        """The trace subject of this address."""
        def tok(v: str | int | None) -> str:
            return NO_TOKEN if v is None else subject_token(v)
        base = f"hx.trace.{subject_token(self.run)}.{tok(self.round)}.{tok(self.task)}.{tok(self.attempt)}"
        return base if self.channel is None else f"{base}.{self.channel}"

    @property
    def bulk(self) -> TraceAddress:
        """The same address without its channel: the attempt's own subject."""
        return self if self.channel is None else TraceAddress(self.run, self.round, self.task, self.attempt)

    @classmethod
    def parse(cls, subject: str) -> TraceAddress:
        """Parse a trace subject; raise ``ValueError`` naming it when it is not one."""
        parts = subject.split(".")
        if len(parts) not in (6, 7) or parts[:2] != ["hx", "trace"]:
            raise ValueError(f"not a trace subject: {subject!r}")
        run, rnd, task, att = parts[2:6]
        channel = parts[6] if len(parts) == 7 else None
        if channel is not None and (not _CHANNEL.fullmatch(channel) or NO_TOKEN in (rnd, task, att)):
            raise ValueError(f"not a trace subject: {subject!r} (a channel token, lowercase letters, follows an "
                             "attempt's subject)")

        def num(t: str) -> int | None:
            if t == NO_TOKEN:
                return None
            try:
                return int(t)
            except ValueError:
                raise ValueError(f"not a trace subject: {subject!r} (round and attempt are numbers)") from None
        return cls(token_value(run), num(rnd), None if task == NO_TOKEN else token_value(task), num(att), channel)


_CHANNEL = re.compile(r"[a-z]+")


def trace_subject(run: str, round: int | None = None, task: str | None = None, attempt: int | None = None,
                  channel: str | None = None) -> str:
    """The subject of a run-, round- or attempt-level trace event (an attempt's summary ``channel``, if given)."""
    return TraceAddress(run, round, task, attempt, channel).subject


def trace_filter(run: str | None = None, round: int | None = None, task: str | None = None,
                 attempt: int | None = None) -> str:
    """A wildcard subject matching trace events, ``None`` meaning any."""
    def tok(v: str | int | None) -> str:
        return "*" if v is None else subject_token(v)
    return f"hx.trace.{tok(run)}.{tok(round)}.{tok(task)}.{tok(attempt)}"
