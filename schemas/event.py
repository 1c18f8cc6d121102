"""The base of every event on the log and the registry of event types.

An event is a frozen msgspec Struct with a stable type name (``TYPE``) and a schema
version (``VERSION``). Both travel in message headers, so the body is only the fields;
subclasses register themselves when they declare a ``TYPE``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeAlias

import msgspec

from schemas.errors import SchemaError


class Event(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every event type; subclasses set ``TYPE`` and ``VERSION``."""

    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    READS: ClassVar[tuple[int, ...]] = ()
    """Older versions whose bodies decode as this one (fields were only added, each with a default)."""
    LEVEL: ClassVar[Literal["", "run", "round", "attempt"]] = ""
    """The trace subjects it belongs on: a run's, a round's or an attempt's (``""``: not checked).
    Readers quarantine an event found elsewhere, and one whose ``run_id``, ``round``, ``task_id``
    or ``attempt`` disagrees with its subject."""

    STARTS: ClassVar[str] = ""
    """The kind of timed call (``model``, ``tool``) this event starts; its stamp is the call's start."""
    ENDS: ClassVar[str] = ""
    """The kind of timed call this event ends; its stamp's ``took_ns`` is the call's duration."""
    CHANNEL: ClassVar[str] = ""
    """For an attempt's few summary events: the subject token, after the attempt's own subject, that the
    event goes on in a message of its own (``started``, ``score``, ``finished``), so that a reader of only
    such types has the server filter out the attempt's bulk (``streams.channels``). Empty: the event
    goes in the attempt's frames with the rest."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.TYPE:
            register(cls)


JsonObject: TypeAlias = dict[str, Any]
"""A JSON object whose shape no hx schema owns: a tool call's arguments, a JSON Schema, a processor's
parameters (each processor type defines and checks its own when it is built), a provider's options.
Fields of this type stay open on purpose; every other event field has a type."""


class Payload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of value types nested inside events (messages, tool calls, usage)."""


_REGISTRY: dict[str, type[Event]] = {}


def register(cls: type[Event]) -> type[Event]:
    """Add an event type to the registry; a second class with the same name is an error."""
    existing = _REGISTRY.get(cls.TYPE)
    if existing is not None and existing is not cls:
        raise SchemaError(
            f"event type {cls.TYPE!r} is declared twice: {existing.__module__}.{existing.__qualname__} "
            f"and {cls.__module__}.{cls.__qualname__}"
        )
    _REGISTRY[cls.TYPE] = cls
    return cls


def event_type(name: str) -> type[Event]:
    """Return the event class registered under ``name`` or raise ``SchemaError``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SchemaError(f"unknown event type {name!r}") from None


def event_types() -> dict[str, type[Event]]:
    """All registered event types by name, sorted by name."""
    return dict(sorted(_REGISTRY.items()))
