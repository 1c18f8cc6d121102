"""The layout marker: from which sequence a stream holds summary events on channels (``streams.channels``).

A writer's first connection to a server marks each trace stream once, in the heads bucket
(key ``layout.<stream>``): from sequence 1 for a stream it creates, from the sequence after
the last message for one an older hx wrote. Readers narrow only the part from the marker on;
with no marker (or one of a stream since deleted and recreated) they read in full, which is
always correct, only slower. An hx older than the channels that writes to the same server
after the marker would put summary events back in its frames, where a narrowed read does not
look: upgrade every writer of a server together.
"""

from __future__ import annotations

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from streams.integrity import HEADS_BUCKET


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """From which sequence a stream holds the channel layout (kept in the heads bucket, key ``layout.<stream>``)."""

    stream: str
    created: str
    """The stream's creation time (ISO 8601), as its head records it: a recreated stream needs a new marker."""
    channels_from: int
    """The first sequence written with summary events on channels (1: the stream never held anything else)."""


def _created(info: StreamInfo) -> str:
    return info.created.isoformat() if info.created else ""


async def mark_layout(js: JetStreamContext, info: StreamInfo, *, fresh: bool) -> Layout:
    """Record, once per stream, the sequence from which it holds channels; return the marker in force.

    ``fresh``: the stream was just created, so it holds channels from sequence 1. Otherwise from
    the sequence after its last message now: what an older hx wrote before stays read in full.
    """
    kv = await js.key_value(HEADS_BUCKET)
    key = f"layout.{info.config.name}"
    created = _created(info)
    mark = Layout(stream=info.config.name or "", created=created,
                  channels_from=1 if fresh else int(info.state.last_seq or 0) + 1)
    for _ in range(5):
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            try:
                await kv.create(key, msgspec.json.encode(mark))
                return mark
            except KeyWrongLastSequenceError:
                continue  # another writer marked it first: read theirs
        try:
            old = msgspec.json.decode(entry.value or b"", type=Layout)
        except msgspec.DecodeError:
            old = None
        if old is not None and old.created == created:
            return old
        try:  # a marker of a stream since deleted and recreated: this stream's own replaces it
            await kv.update(key, msgspec.json.encode(mark), last=entry.revision)
            return mark
        except KeyWrongLastSequenceError:
            continue
    return mark


async def channels_from(js: JetStreamContext, info: StreamInfo) -> int | None:
    """The first sequence of ``info``'s stream known to hold channels; None when unknown (read it all in full)."""
    try:
        kv = await js.key_value(HEADS_BUCKET)
        entry = await kv.get(f"layout.{info.config.name}")
        mark = msgspec.json.decode(entry.value or b"", type=Layout)
    except (KeyNotFoundError, NotFoundError, msgspec.DecodeError, nats.errors.Error):
        return None
    return mark.channels_from if mark.created == _created(info) else None
