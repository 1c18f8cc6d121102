"""The stream topology, declared in one place and applied idempotently at start.

``HX_TRACE`` holds every attempt's events on ``hx.trace.<run>.<round>.<task>.<attempt>``;
``HX_LEDGER`` is the immutable edit ledger (no delete, no purge, no age limit);
``HX_LEARN`` holds learner records. Blobs go to an object store addressed by sha256,
projection positions to a KV bucket. A stream that exists with another configuration is
reported, never silently changed.
"""

from __future__ import annotations

import re
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
)
from nats.js.errors import NotFoundError

from streams.errors import TopologyMismatch

DUPLICATE_WINDOW_S = 120.0


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

    def differences(self, actual: StreamConfig) -> list[str]:
        """Human-readable differences between this spec and an existing stream's config."""
        want: dict[str, Any] = {
            "subjects": sorted(self.subjects), "deny_delete": self.deny_delete,
            "deny_purge": self.deny_purge, "max_age": float(self.max_age_s),
            "duplicate_window": float(self.duplicate_window_s), "storage": StorageType.FILE,
            "retention": RetentionPolicy.LIMITS,
        }
        have: dict[str, Any] = {
            "subjects": sorted(actual.subjects or []), "deny_delete": bool(actual.deny_delete),
            "deny_purge": bool(actual.deny_purge), "max_age": float(actual.max_age or 0.0),
            "duplicate_window": float(actual.duplicate_window or 0.0), "storage": actual.storage,
            "retention": actual.retention,
        }
        return [f"{k}: declared {want[k]!r}, found {have[k]!r}" for k in want if want[k] != have[k]]


TRACE = StreamSpec("HX_TRACE", ("hx.trace.>",), "hook events, model and tool calls, scores of every attempt")
LEDGER = StreamSpec("HX_LEDGER", ("hx.ledger.>",), "the immutable edit ledger: candidates, verdicts, ships",
                    deny_delete=True, deny_purge=True)
LEARN = StreamSpec("HX_LEARN", ("hx.learn.>",), "learner records: policy updates, checkpoints")
STREAMS: tuple[StreamSpec, ...] = (TRACE, LEDGER, LEARN)
BLOB_STORE = "hx_blobs"
POSITIONS_BUCKET = "hx_positions"
SPECS = {spec.name: spec for spec in STREAMS}


async def apply_topology(js: JetStreamContext) -> None:
    """Create every declared stream and bucket that is missing; refuse ones that differ."""
    for spec in STREAMS:
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await js.add_stream(spec.config())
            continue
        diffs = spec.differences(info.config)
        if diffs:
            raise TopologyMismatch(f"stream {spec.name} exists with another configuration: " + "; ".join(diffs))
    try:
        await js.key_value(POSITIONS_BUCKET)
    except NotFoundError:
        await js.create_key_value(KeyValueConfig(bucket=POSITIONS_BUCKET, history=1,
                                                 storage=StorageType.FILE))
    try:
        await js.object_store(BLOB_STORE)
    except NotFoundError:
        await js.create_object_store(BLOB_STORE, ObjectStoreConfig(storage=StorageType.FILE))


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


@dataclass(frozen=True)
class TraceAddress:
    """The run, round, task and attempt a trace subject names (None where a placeholder)."""

    run: str
    round: int | None = None
    task: str | None = None
    attempt: int | None = None

    @property
    def subject(self) -> str:
        """The trace subject of this address."""
        def tok(v: str | int | None) -> str:
            return NO_TOKEN if v is None else subject_token(v)
        return f"hx.trace.{subject_token(self.run)}.{tok(self.round)}.{tok(self.task)}.{tok(self.attempt)}"

    @classmethod
    def parse(cls, subject: str) -> TraceAddress:
        """Parse a trace subject; raise ``ValueError`` naming it when it is not one."""
        parts = subject.split(".")
        if len(parts) != 6 or parts[:2] != ["hx", "trace"]:
            raise ValueError(f"not a trace subject: {subject!r}")
        run, rnd, task, att = parts[2:]

        def num(t: str) -> int | None:
            if t == NO_TOKEN:
                return None
            try:
                return int(t)
            except ValueError:
                raise ValueError(f"not a trace subject: {subject!r} (round and attempt are numbers)") from None
        return cls(token_value(run), num(rnd), None if task == NO_TOKEN else token_value(task), num(att))


def trace_subject(run: str, round: int | None = None, task: str | None = None, attempt: int | None = None) -> str:
    """The subject of a run-, round- or attempt-level trace event."""
    return TraceAddress(run, round, task, attempt).subject


def trace_filter(run: str | None = None, round: int | None = None, task: str | None = None,
                 attempt: int | None = None) -> str:
    """A wildcard subject matching trace events, ``None`` meaning any."""
    def tok(v: str | int | None) -> str:
        return "*" if v is None else subject_token(v)
    return f"hx.trace.{tok(run)}.{tok(round)}.{tok(task)}.{tok(attempt)}"
