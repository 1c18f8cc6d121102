"""The envelope: how an event becomes a NATS message and back.

A message's body is msgpack of the event's fields. Its headers carry the event's type
(``Hx-Type``), schema version (``Hx-Schema-Version``), wall-clock time (``Hx-Time``, in
nanoseconds; kept out of the body so replayed bodies compare equal) and a deterministic
``Nats-Msg-Id`` so the server drops a retried duplicate. A *frame* packs several events
into one message (``Hx-Type: hx.frame``, ``Hx-Count: n``): the NATS client's per-message
cost dominates small events, so frames are how bulk writers and readers go fast.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from schemas.errors import DecodeError, SchemaError
from schemas.event import Event, event_type

HX_TYPE = "Hx-Type"
HX_SCHEMA_VERSION = "Hx-Schema-Version"
HX_TIME = "Hx-Time"
HX_COUNT = "Hx-Count"
MSG_ID = "Nats-Msg-Id"
FRAME_TYPE = "hx.frame"
HX_ENCODING = "Hx-Encoding"
"""Header of a message whose body is compressed: ``deflate`` (zlib). Absent: the body is as encoded."""
DEFLATE = "deflate"

# Dict keys are sorted so equal events encode to equal bytes (content keys, replay comparisons).
_encoder = msgspec.msgpack.Encoder(order="deterministic")
_readers: dict[str, tuple[msgspec.msgpack.Decoder[Event], type[Event]]] = {}


class Record(msgspec.Struct, frozen=True, gc=False):
    """A decoded event with its place on the log."""

    seq: int
    """Stream sequence of the message holding the event."""
    index: int
    """Position inside a frame (0 for a single-event message)."""
    subject: str
    type: str
    version: int
    time_ns: int
    event: Event

    @property
    def position(self) -> tuple[int, int]:
        """The event's total order on its stream: (sequence, index in frame)."""
        return (self.seq, self.index)


class _FrameItem(msgspec.Struct, array_like=True, frozen=True):
    type: str
    version: int
    body: msgspec.Raw


_frame_decoder = msgspec.msgpack.Decoder(list[_FrameItem])


def encode_body(event: Event) -> bytes:
    """Encode an event's fields as msgpack."""
    if not type(event).TYPE:
        raise SchemaError(f"{type(event).__qualname__} has no TYPE and cannot go on the log")
    return _encoder.encode(event)


def headers_for(type_name: str, version: int, msg_id: str, time_ns: int, count: int | None = None) -> dict[str, str]:
    """The headers of a message holding one event (or a frame of ``count``)."""
    headers = {HX_TYPE: type_name, HX_SCHEMA_VERSION: str(version), HX_TIME: str(time_ns), MSG_ID: msg_id}
    if count is not None:
        headers[HX_COUNT] = str(count)
    return headers


def _reader(type_name: str) -> tuple[msgspec.msgpack.Decoder[Event], type[Event]]:
    """The decoder and class of a registered type (``DecodeError`` when unknown)."""
    known = _readers.get(type_name)
    if known is None:
        try:
            cls = event_type(type_name)
        except SchemaError as exc:
            raise DecodeError(str(exc)) from None
        known = _readers[type_name] = (msgspec.msgpack.Decoder(cls), cls)
    return known


def decode_body(type_name: str, version: int | str | None, body: bytes) -> Event:
    """Decode one event body strictly: unknown type, other version or bad body raise ``DecodeError``."""
    dec, cls = _reader(type_name)
    expected = cls.VERSION
    if version != expected:  # an int equal to the version skips the parsing
        try:
            got = int(version) if version is not None else None
        except ValueError:
            got = None
        if got != expected and got not in cls.READS:
            raise DecodeError(f"event type {type_name!r} has schema version {version!r}; "
                              f"this hx reads {expected}")
    try:
        return dec.decode(body)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed {type_name!r} body: {exc}") from None


EncodedEvent = tuple[str, int, bytes]
"""An event already encoded: (type, schema version, body), as a frame holds it."""


def encoded(event: Event) -> EncodedEvent:
    """``event`` encoded as a frame holds it."""
    cls = type(event)
    return (cls.TYPE, cls.VERSION, encode_body(event))


def encode_frame_bodies(items: Sequence[EncodedEvent]) -> bytes:
    """A frame body from already encoded events."""
    return _encoder.encode([_FrameItem(t, v, msgspec.Raw(body)) for t, v, body in items])


def encode_frame(events: Iterable[Event]) -> bytes:
    """Pack several events into one frame body."""
    return encode_frame_bodies([encoded(e) for e in events])


def decode_frame(body: bytes) -> list[tuple[str, int, Event]]:
    """Unpack a frame into (type, version, event) triples, strictly."""
    return [(r.type, r.version, r.event) for r in _frame_records("", 0, 0, body)]


def deflate(body: bytes) -> bytes:
    """A frame body compressed for the log (zlib, level 1: fast, and ample for these bodies)."""
    return zlib.compress(body, 1)


def inflate(encoding: str, body: bytes) -> bytes:
    """The body of a message whose ``Hx-Encoding`` is ``encoding``; ``DecodeError`` if it cannot be read."""
    if encoding != DEFLATE:
        raise DecodeError(f"unknown {HX_ENCODING} {encoding!r}")
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        raise DecodeError(f"corrupt {DEFLATE} body: {exc}") from None


def _frame_records(subject: str, seq: int, time_ns: int, body: bytes) -> list[Record]:
    """``decode_frame`` straight into records, in one pass (the hot loop of every rebuild)."""
    try:
        items = _frame_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed frame: {exc}") from None
    out: list[Record] = []
    append = out.append
    readers = _readers
    for i, it in enumerate(items):
        t, v = it.type, it.version
        known = readers.get(t)
        if known is not None and v == known[1].VERSION:
            try:
                ev = known[0].decode(it.body)
            except msgspec.DecodeError as exc:
                raise DecodeError(f"malformed {t!r} body: {exc}") from None
        else:
            ev = decode_body(t, v, it.body)  # first of its type, or a version mismatch: the strict path
        append(Record(seq, i, subject, t, v, time_ns, ev))
    return out


class OpenedMessage:
    """A message from the log opened but not decoded: how many events it holds, and any one of them on demand.

    A reader that needs one event of a frame (an evidence anchor) decodes that one, not the
    hundreds beside it.
    """

    def __init__(self, subject: str, seq: int, headers: Mapping[str, str] | None, body: bytes) -> None:
        hdrs = headers or {}
        self.subject, self.seq = subject, seq
        self._version: str | None = hdrs.get(HX_SCHEMA_VERSION)
        type_name = hdrs.get(HX_TYPE)
        try:
            if type_name is None:
                raise DecodeError(f"missing {HX_TYPE} header")
            try:
                self._time_ns = int(hdrs.get(HX_TIME, "0"))
            except ValueError:
                raise DecodeError(f"bad {HX_TIME} header {hdrs.get(HX_TIME)!r}") from None
            encoding = hdrs.get(HX_ENCODING)
            body = inflate(encoding, body) if encoding is not None else body
            self._frame = type_name == FRAME_TYPE
            if self._frame:
                try:
                    self._items = _frame_decoder.decode(body)
                except msgspec.DecodeError as exc:
                    raise DecodeError(f"malformed frame: {exc}") from None
            else:
                self._items = [_FrameItem(type_name, 0, msgspec.Raw(body))]
        except DecodeError as exc:
            raise exc.at(subject=subject, seq=seq) from None

    def __len__(self) -> int:
        return len(self._items)

    def record(self, index: int) -> Record:
        """The event at ``index`` decoded (``DecodeError`` naming the message when it does not decode)."""
        it = self._items[index]
        try:
            event = decode_body(it.type, it.version if self._frame else self._version, bytes(it.body))
        except DecodeError as exc:
            raise exc.at(subject=self.subject, seq=self.seq) from None
        version = it.version if self._frame else int(self._version or 0)
        return Record(self.seq, index, self.subject, it.type, version, self._time_ns, event)


def decode_message(subject: str, seq: int, headers: Mapping[str, str] | None, body: bytes) -> list[Record]:
    """Decode a message from the log into records, or raise ``DecodeError`` naming subject and sequence.

    A body with an ``Hx-Encoding`` header is inflated first.
    """
    hdrs = headers or {}
    type_name = hdrs.get(HX_TYPE)
    try:
        if type_name is None:
            raise DecodeError(f"missing {HX_TYPE} header")
        try:
            time_ns = int(hdrs.get(HX_TIME, "0"))
        except ValueError:
            raise DecodeError(f"bad {HX_TIME} header {hdrs.get(HX_TIME)!r}") from None
        encoding = hdrs.get(HX_ENCODING)
        if encoding is not None:
            body = inflate(encoding, body)
        if type_name == FRAME_TYPE:
            return _frame_records(subject, seq, time_ns, body)
        version = hdrs.get(HX_SCHEMA_VERSION)
        event = decode_body(type_name, version, body)
        # The version as stored (an older one the class READS included), as a frame's items report it.
        return [Record(seq, 0, subject, type_name, int(version or 0), time_ns, event)]
    except DecodeError as exc:
        raise exc.at(subject=subject, seq=seq) from None
