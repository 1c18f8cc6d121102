"""What an append sends: each event, or frame of events, as one ``Outgoing`` message with its id.

``EventLog`` (``streams.log``) builds its messages here and sends them. A message's body is
scrubbed of known secrets (``streams.redaction``); a frame packs several events into one
message, stored together or not at all. Every message carries a deterministic
``Nats-Msg-Id``: the caller's key (an event's position in its run, e.g. ``<subject>#<n>``)
or, without one, a hash of subject, type and body (``content_key``). A retried append
therefore lands once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from nats.js.errors import APIError

from schemas.envelope import (
    DEFLATE,
    FRAME_TYPE,
    HX_ENCODING,
    UNSTAMPED,
    EncodedEvent,
    Stamp,
    deflate,
    encode_body,
    encode_frame_bodies,
    encoded,
    event_headers,
    frame_headers,
)
from schemas.event import Event
from streams.errors import LogError
from streams.redaction import known_bytes, needs_scrub, scrub_body

COMPRESS_MIN_BYTES = 16 * 1024
"""Frames from ``send_frame`` at least this large are deflated. A run loop's frames repeat a step's
observation and tool result in several events (hook records before and after, the tool and environment
events): zlib level 1 shrinks them ~13x at ~375 MB/s, less work than the client and the server spend
moving the raw bytes."""


@dataclass(frozen=True)
class Entry:
    """One event to append: where it goes and the key that makes its append idempotent."""

    subject: str
    event: Event
    key: str | None = None
    stamp: Stamp | None = None
    """When the event happened (the time of the append, when not given)."""


@dataclass(frozen=True)
class Outgoing:
    """One message ready to publish: subject, body, headers and its message id (``key``)."""

    subject: str
    body: bytes
    headers: dict[str, str]
    key: str

    def rejected(self, exc: APIError) -> LogError:
        """The error for a message the server refused."""
        return LogError(f"append to {self.subject!r} rejected: {exc.description}")

    def too_large(self, max_payload: int) -> LogError:
        """The error for a message over the server's payload limit."""
        return LogError(f"append to {self.subject!r}: {len(self.body)} bytes exceed the server's maximum payload "
                        f"({max_payload})")


def content_key(subject: str, type_name: str, body: bytes) -> str:
    """The default message id: a hash of where the event goes and what it says."""
    digest = hashlib.sha256(subject.encode() + b"\0" + type_name.encode() + b"\0" + body).hexdigest()
    return digest[:40]


def _scrubbed_frame(items: Sequence[EncodedEvent], sent: Stamp) -> bytes:
    """A frame body sent at ``sent`` with no secret in it: the usual case costs one byte search per known secret."""
    body = encode_frame_bodies(items, sent)
    known = known_bytes()
    if not needs_scrub(body, known):
        return body
    return encode_frame_bodies([(t, v, scrub_body(b, known), s) for t, v, b, s in items], sent)


def entry_message(entry: Entry, now: Stamp, known: tuple[bytes, ...] | None = None) -> Outgoing:
    """One event as one message, stamped ``now`` unless the entry has its own stamp; ``known`` (the secrets to
    scrub) is looked up when not given."""
    body = scrub_body(encode_body(entry.event), known)
    cls = type(entry.event)
    key = entry.key or content_key(entry.subject, cls.TYPE, body)
    return Outgoing(entry.subject, body, event_headers(cls.TYPE, cls.VERSION, key, entry.stamp or now), key)


def frame_message(subject: str, events: Sequence[Event], key: str | None, now: Stamp,
                  stamps: Sequence[Stamp | None] | None = None) -> Outgoing:
    """Several events as one frame message sent ``now``, keyed by ``key`` or else by its content.

    Each event is stamped by ``stamps`` (same order) where given, else ``now``. The content key leaves
    the stamps out, so the same events sent again dedupe whenever they were sent.
    """
    items = [encoded(e, (stamps[i] if stamps is not None else None) or now) for i, e in enumerate(events)]
    body = _scrubbed_frame(items, now)
    key = key or content_key(subject, FRAME_TYPE, _scrubbed_frame(items, UNSTAMPED))
    return Outgoing(subject, body, frame_headers(key, now, len(events)), key)


def encoded_frame_message(subject: str, items: Sequence[EncodedEvent], key: str, now: Stamp) -> Outgoing:
    """Already encoded events as one frame message sent ``now``, deflated from ``COMPRESS_MIN_BYTES`` on."""
    body = _scrubbed_frame(items, now)
    headers = frame_headers(key, now, len(items))
    if len(body) >= COMPRESS_MIN_BYTES:
        body = deflate(body)
        headers[HX_ENCODING] = DEFLATE
    return Outgoing(subject, body, headers, key)


def pack_frames(entries: list[Entry], frame_size: int, now: Stamp) -> list[Outgoing]:
    """Consecutive entries for the same subject packed into frame messages of up to ``frame_size`` events."""
    out: list[Outgoing] = []
    i = 0
    while i < len(entries):
        subject = entries[i].subject
        j = i
        while j < len(entries) and j - i < frame_size and entries[j].subject == subject:
            j += 1
        # A frame's key derives from its first event's key, so a retried batch dedupes.
        first = entries[i].key
        out.append(frame_message(subject, [e.event for e in entries[i:j]],
                                 f"{first}+{j - i}" if first else None, now, [e.stamp for e in entries[i:j]]))
        i = j
    return out
