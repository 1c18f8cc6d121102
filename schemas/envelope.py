"""The envelope: how an event becomes a NATS message and back.

A message's body is msgpack of the event's fields. Its headers carry the event's type
(``Hx-Type``), schema version (``Hx-Schema-Version``), wall-clock time (``Hx-Time``, in
nanoseconds) and a deterministic ``Nats-Msg-Id`` so the server drops a retried duplicate.
A *frame* packs several events into one message (``Hx-Type: hx.frame``, ``Hx-Count: n``):
the NATS client's per-message cost dominates small events, so frames are how bulk writers
and readers go fast.

When an event happened is its ``Stamp``: the wall clock and the writing process's monotonic
clock when it was emitted, and, on an event that ends a timed call (a model's response or
error, a tool's return), how long the call took on the monotonic clock. A stamp travels in the
envelope, never in the body: a replayed run happens at other times, and its bodies must still
compare equal to the recorded ones. A single-event message carries its stamp in headers
(``Hx-Time``, ``Hx-Mono``, ``Hx-Took``); a frame carries one per event beside its body, and its
own ``Hx-Time`` is when the frame was sent, so a reader can tell when a thing happened from when
it reached the log.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Container, Iterable, Mapping, Sequence

import msgspec

from schemas.errors import DecodeError, SchemaError
from schemas.event import Event, event_type
from schemas.frozen import reading_log

HX_TYPE = "Hx-Type"
HX_SCHEMA_VERSION = "Hx-Schema-Version"
HX_TIME = "Hx-Time"
HX_MONO = "Hx-Mono"
"""Header: the writer's monotonic clock (ns) when a single-event message's event happened."""
HX_TOOK = "Hx-Took"
"""Header: how long the call a single-event message's event ends took (ns); absent when it ends none."""
HX_COUNT = "Hx-Count"
MSG_ID = "Nats-Msg-Id"
FRAME_TYPE = "hx.frame"
HX_ENCODING = "Hx-Encoding"
"""Header of a message whose body is compressed: ``deflate`` (zlib). Absent: the body is as encoded."""
DEFLATE = "deflate"

# Dict keys are sorted so equal events encode to equal bytes (content keys, replay comparisons).
_encoder = msgspec.msgpack.Encoder(order="deterministic")
_readers: dict[str, tuple[msgspec.msgpack.Decoder[Event], type[Event]]] = {}


class Stamp(msgspec.Struct, frozen=True, gc=False):
    """When an event happened: wall clock and the writer's monotonic clock (ns), and the call it ends took."""

    wall_ns: int
    mono_ns: int = 0
    """``time.monotonic_ns()`` in the process that emitted the event: compare only within one attempt."""
    took_ns: int = 0
    """On an event that ends a timed call (``Event.ENDS``): the call's duration; 0 otherwise."""

    @classmethod
    def now(cls, took_ns: int = 0) -> Stamp:
        """The stamp of an event happening now."""
        return cls(time.time_ns(), time.monotonic_ns(), took_ns)


UNSTAMPED = Stamp(0)
"""The stamp of an event whose time was not recorded: readers take its message's ``Hx-Time``."""


class Record(msgspec.Struct, frozen=True, gc=False):
    """A decoded event with its place on the log and when it happened."""

    seq: int
    """Stream sequence of the message holding the event."""
    index: int
    """Position inside a frame (0 for a single-event message)."""
    subject: str
    type: str
    version: int
    time_ns: int
    """When the event happened (wall clock, ns); for an event written before hx stamped events, when its
    message reached the log."""
    event: Event
    mono_ns: int = 0
    """The writer's monotonic clock when the event happened (0: not recorded)."""
    took_ns: int = 0
    """How long the call this event ends took (0: it ends none, or not recorded)."""
    frame_ns: int = 0
    """When the message holding the event was sent (its ``Hx-Time``)."""

    @property
    def position(self) -> tuple[int, int]:
        """The event's total order on its stream: (sequence, index in frame)."""
        return (self.seq, self.index)

    @property
    def start_ns(self) -> int:
        """When the call this event ends began (wall clock); the event's own time when it ends none."""
        return self.time_ns - self.took_ns


class _FrameItem(msgspec.Struct, array_like=True, frozen=True):
    type: str
    version: int
    body: msgspec.Raw
    # The event's stamp, in microseconds before the frame was sent (its Hx-Time and Hx-Mono): small numbers, a few
    # bytes each, where absolute nanoseconds would cost 9 bytes each and defeat the log's compression.
    # Frames written before events were stamped have none (ago_us -1).
    ago_us: int = -1
    mono_ago_us: int = 0
    took_us: int = 0


_frame_decoder = msgspec.msgpack.Decoder(list[_FrameItem])


LaterFields = Mapping[str, object]
"""Fields added to an event type after it was first written, with their defaults: a default value; a mapping for a
nested struct's fields; a one-item list holding such a mapping for each item of a list of structs."""
_LATER: dict[str, LaterFields] = {}
_plain = msgspec.msgpack.Encoder()  # keeps the decoded maps' order: the struct's field order, as first encoded


def later_fields(event: type[Event], fields: LaterFields) -> None:
    """Declare fields added to ``event`` after it was first written: at their defaults they are left out of its
    encoding, so an event of the older shape encodes to the very bytes it was stored (and digested) as."""
    _LATER[event.TYPE] = fields


def _trim(fields: dict[str, object], later: LaterFields) -> None:
    for name, default in later.items():
        value = fields.get(name)
        if isinstance(default, Mapping):
            if isinstance(value, dict):
                _trim(value, default)
        elif isinstance(default, list):
            for item in value if isinstance(value, list) else ():
                if isinstance(item, dict):
                    _trim(item, default[0])
        elif name in fields and value == msgspec.msgpack.decode(msgspec.msgpack.encode(default)):
            del fields[name]  # compared as stored: a tuple reads back as a list, a struct as a map


def encode_body(event: Event) -> bytes:
    """Encode an event's fields as msgpack (fields added later left out at their defaults: ``later_fields``)."""
    if not type(event).TYPE:
        raise SchemaError(f"{type(event).__qualname__} has no TYPE and cannot go on the log")
    body = _encoder.encode(event)
    later = _LATER.get(type(event).TYPE)
    if later is None:
        return body
    fields = msgspec.msgpack.decode(body)
    _trim(fields, later)
    return _plain.encode(fields)


def headers_for(type_name: str, version: int, msg_id: str, time_ns: int, count: int | None = None) -> dict[str, str]:
    """The headers of a message holding one event (or a frame of ``count``) at ``time_ns``, without clocks."""
    headers = {HX_TYPE: type_name, HX_SCHEMA_VERSION: str(version), HX_TIME: str(time_ns), MSG_ID: msg_id}
    if count is not None:
        headers[HX_COUNT] = str(count)
    return headers


def event_headers(type_name: str, version: int, msg_id: str, stamp: Stamp) -> dict[str, str]:
    """The headers of a message holding one event that happened at ``stamp``."""
    headers = headers_for(type_name, version, msg_id, stamp.wall_ns)
    headers[HX_MONO] = str(stamp.mono_ns)
    if stamp.took_ns:
        headers[HX_TOOK] = str(stamp.took_ns)
    return headers


def frame_headers(msg_id: str, sent: Stamp, count: int) -> dict[str, str]:
    """The headers of a frame of ``count`` events sent at ``sent`` (its events' stamps are relative to it)."""
    headers = headers_for(FRAME_TYPE, 1, msg_id, sent.wall_ns, count=count)
    headers[HX_MONO] = str(sent.mono_ns)
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
        with reading_log():
            return dec.decode(body)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed {type_name!r} body: {exc}") from None


EncodedEvent = tuple[str, int, bytes, Stamp]
"""An event already encoded: (type, schema version, body, when it happened), as a frame holds it."""


def encoded(event: Event, stamp: Stamp | None = None) -> EncodedEvent:
    """``event`` encoded as a frame holds it, stamped ``stamp`` (now, when not given)."""
    cls = type(event)
    return (cls.TYPE, cls.VERSION, encode_body(event), stamp or Stamp.now())


def encode_frame_bodies(items: Sequence[EncodedEvent], sent: Stamp = UNSTAMPED) -> bytes:
    """A frame body from already encoded events, for a frame sent at ``sent`` (``frame_headers``).

    Each event's stamp is kept to the microsecond, relative to ``sent``; unstamped events, or any event
    of a frame sent without a time, keep none.
    """
    if not sent.wall_ns:
        return _encoder.encode([_FrameItem(t, v, msgspec.Raw(body)) for t, v, body, _ in items])
    wall, mono = sent.wall_ns, sent.mono_ns
    return _encoder.encode([
        _FrameItem(t, v, msgspec.Raw(body), (wall - s.wall_ns) // 1000, (mono - s.mono_ns) // 1000, s.took_ns // 1000)
        if s.wall_ns else _FrameItem(t, v, msgspec.Raw(body))
        for t, v, body, s in items])


def encode_frame(events: Iterable[Event], stamp: Stamp = UNSTAMPED) -> bytes:
    """Pack several events, all stamped ``stamp`` and sent then, into one frame body (by default unstamped: a
    reader then takes the frame's ``Hx-Time`` as their time; the same events give the same bytes)."""
    return encode_frame_bodies([encoded(e, stamp) for e in events], stamp)


def decode_frame(body: bytes) -> list[tuple[str, int, Event]]:
    """Unpack a frame into (type, version, event) triples, strictly."""
    return [(r.type, r.version, r.event) for r in _frame_records("", 0, 0, 0, body)]


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


def _frame_records(subject: str, seq: int, time_ns: int, mono_ns: int, body: bytes,
                   types: Container[str] = ()) -> list[Record]:
    """``decode_frame`` straight into records, in one pass (the hot loop of every rebuild); with ``types``, only
    the events of those types (the others' bodies are never decoded)."""
    try:
        items = _frame_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed frame: {exc}") from None
    out: list[Record] = []
    append = out.append
    readers = _readers
    with reading_log():  # values read back are not frozen for processors (schemas.frozen)
        _append_records(items, subject, seq, time_ns, mono_ns, types, append, readers)
    return out


def _append_records(items: list[_FrameItem], subject: str, seq: int, time_ns: int, mono_ns: int,
                    types: Container[str], append: Callable[[Record], None],
                    readers: dict[str, tuple[msgspec.msgpack.Decoder[Event], type[Event]]]) -> None:
    """The records of a frame's items, appended (the body of ``_frame_records``)."""
    for i, it in enumerate(items):
        t, v = it.type, it.version
        if types and t not in types:
            continue
        known = readers.get(t)
        if known is not None and v == known[1].VERSION:
            try:
                ev = known[0].decode(it.body)
            except msgspec.DecodeError as exc:
                raise DecodeError(f"malformed {t!r} body: {exc}") from None
        else:
            ev = decode_body(t, v, it.body)  # first of its type, or a version mismatch: the strict path
        if it.ago_us < 0:
            append(Record(seq, i, subject, t, v, time_ns, ev, 0, 0, time_ns))
        else:
            append(Record(seq, i, subject, t, v, time_ns - it.ago_us * 1000, ev, mono_ns - it.mono_ago_us * 1000,
                          it.took_us * 1000, time_ns))


def _header_int(headers: Mapping[str, str], name: str) -> int:
    """An optional integer header (0 when absent); ``DecodeError`` naming it when it is not an integer."""
    value = headers.get(name)
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise DecodeError(f"bad {name} header {value!r}") from None


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
            self._mono_ns = _header_int(hdrs, HX_MONO)
            self._took_ns = 0
            if self._frame:
                try:
                    self._items = _frame_decoder.decode(body)
                except msgspec.DecodeError as exc:
                    raise DecodeError(f"malformed frame: {exc}") from None
            else:
                self._items = [_FrameItem(type_name, 0, msgspec.Raw(body))]
                self._took_ns = _header_int(hdrs, HX_TOOK)
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
        if not self._frame:
            return Record(self.seq, 0, self.subject, it.type, version, self._time_ns, event, self._mono_ns,
                          self._took_ns, self._time_ns)
        if it.ago_us < 0:
            return Record(self.seq, index, self.subject, it.type, version, self._time_ns, event, 0, 0, self._time_ns)
        return Record(self.seq, index, self.subject, it.type, version, self._time_ns - it.ago_us * 1000, event,
                      self._mono_ns - it.mono_ago_us * 1000, it.took_us * 1000, self._time_ns)


def decode_message(subject: str, seq: int, headers: Mapping[str, str] | None, body: bytes,
                   types: Container[str] = ()) -> list[Record]:
    """Decode a message from the log into records, or raise ``DecodeError`` naming subject and sequence.

    A body with an ``Hx-Encoding`` header is inflated first. With ``types``, only the events of those
    types become records: the bodies of the others are never decoded (nor checked).
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
        if types and type_name != FRAME_TYPE and type_name not in types:
            return []
        encoding = hdrs.get(HX_ENCODING)
        if encoding is not None:
            body = inflate(encoding, body)
        if type_name == FRAME_TYPE:
            return _frame_records(subject, seq, time_ns, _header_int(hdrs, HX_MONO), body, types)
        version = hdrs.get(HX_SCHEMA_VERSION)
        event = decode_body(type_name, version, body)
        # The version as stored (an older one the class READS included), as a frame's items report it.
        return [Record(seq, 0, subject, type_name, int(version or 0), time_ns, event,
                       _header_int(hdrs, HX_MONO), _header_int(hdrs, HX_TOOK), time_ns)]
    except DecodeError as exc:
        raise exc.at(subject=subject, seq=seq) from None
