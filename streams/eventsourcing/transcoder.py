"""A msgspec-backed ``eventsourcing`` transcoder that writes the same JSON as ``JSONTranscoder``.

Event state is tagged exactly like the library's ``JSONTranscoder`` does it: a value of a
type with a registered ``Transcoding`` becomes ``{"_type_": name, "_data_": ...}``. So data
written by either transcoder is read by the other, and ``Application.register_transcodings``
keeps working (this class *is* a ``JSONTranscoder``). The C encoder and decoder of msgspec
do the byte work; a Python walk does the tagging, because msgspec natively encodes UUID,
datetime, Decimal and tuples in ways that would not come back as those types.

Beyond ``JSONTranscoder``, a transcoding registered for ``tuple`` or for a subclass of
``dict``/``list``/``str``/``int``/``float`` is honoured (the stdlib encoder never asks for
those), so such values can round-trip with their type; unregistered, they degrade to the
JSON base type exactly as with ``JSONTranscoder``.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    TranscodingNotRegisteredError,
    UUIDAsHex,
)

_TYPE = "_type_"
_DATA = "_data_"


class MsgspecTranscoder(JSONTranscoder):
    """``JSONTranscoder``-compatible transcoder whose JSON bytes are produced by msgspec."""

    def __init__(self) -> None:
        super().__init__()
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder()
        # Every Application registers these three anyway; registering them here too makes
        # the transcoder useful on its own (a later registration for the type wins).
        self.register(UUIDAsHex())
        self.register(DecimalAsStr())
        self.register(DatetimeAsISO())

    def encode(self, obj: Any) -> bytes:
        """Encode ``obj`` as compact UTF-8 JSON, tagging registered types."""
        return self._encoder.encode(self._tag(obj))

    def decode(self, data: bytes) -> Any:
        """Decode JSON bytes, turning tagged objects back into their registered types."""
        try:
            obj = self._decoder.decode(data)
        except msgspec.DecodeError as e:
            raise ValueError(f"invalid JSON: {e}") from e
        # Both encoders write the "_type_" key literally (only non-ASCII is ever escaped,
        # and an escaped quote inside a string cannot match), so counting it bounds the
        # number of dicts the walk must find; it stops once all are seen. A "\u" escape
        # could hide a key, so then the walk visits everything.
        budget = math.inf if b"\\u" in data else data.count(b'"_type_"')
        if budget == 0:
            return obj
        return self._untag(obj, [budget])

    def _tag(self, obj: Any) -> Any:
        """Return ``obj`` with registered types tagged; unchanged containers are not copied."""
        kind = type(obj)
        if kind is dict:
            copy: dict[Any, Any] | None = None
            for key, value in obj.items():
                vkind = type(value)
                # Inline the common leaves: a call per leaf would cost more than the JSON work.
                if vkind is str or vkind is int or vkind is bool or value is None:
                    continue
                tagged = self._tag(value)
                if tagged is not value:
                    if copy is None:
                        copy = dict(obj)
                    copy[key] = tagged
            return obj if copy is None else copy
        if kind is list:
            items: list[Any] | None = None
            for index, value in enumerate(obj):
                vkind = type(value)
                if vkind is str or vkind is int or vkind is bool or value is None:
                    continue
                tagged = self._tag(value)
                if tagged is not value:
                    if items is None:
                        items = list(obj)
                    items[index] = tagged
            return obj if items is None else items
        if kind is str or kind is int or kind is bool or obj is None:
            return obj
        if kind is float:
            if not math.isfinite(obj):
                raise ValueError("Out of range float values are not JSON compliant")
            return obj
        transcoding = self.types.get(kind)
        if transcoding is not None:
            return {_TYPE: transcoding.name, _DATA: self._tag(transcoding.encode(obj))}
        # Unregistered JSON-native kinds degrade to their base type, as the stdlib does.
        if isinstance(obj, dict):
            return self._tag(dict(obj))
        if isinstance(obj, list | tuple):
            return self._tag(list(obj))
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return self._tag(float(obj))
        raise TranscodingNotRegisteredError(
            f"Object of type {kind} is not serializable. Please define and register "
            "a custom transcoding for this type."
        )

    def _untag(self, obj: Any, budget: list[float]) -> Any:
        """Replace tagged dicts (innermost first, like json's object_hook) until ``budget`` is spent."""
        kind = type(obj)
        if kind is dict:
            if _TYPE in obj:
                budget[0] -= 1
                if len(obj) == 2 and _DATA in obj:
                    name = obj[_TYPE]
                    transcoding = self.names.get(name) if isinstance(name, str) else None
                    if transcoding is None:
                        raise TranscodingNotRegisteredError(
                            f"Data serialized with name '{name}' is not deserializable. "
                            "Please register a custom transcoding for this type."
                        )
                    return transcoding.decode(self._untag(obj[_DATA], budget))
            for key, value in obj.items():
                if budget[0] <= 0:
                    break
                if type(value) is dict or type(value) is list:
                    obj[key] = self._untag(value, budget)
            return obj
        if kind is list:
            for index, value in enumerate(obj):
                if budget[0] <= 0:
                    break
                if type(value) is dict or type(value) is list:
                    obj[index] = self._untag(value, budget)
        return obj
