"""When a projection's own code fails: its fold raises or exits, or its state cannot be encoded.

A projection (a plugin above all) is code hx did not write, run inside hx's command. Whatever
it raises while folding, encoding its state or being built is its failure, reported as one
``ProjectionFailed`` naming the projection, the event it failed on (stream sequence, subject,
type) and the exception; ``SystemExit`` too, so a plugin's ``sys.exit(0)`` is never taken as
the command's own exit. ``KeyboardInterrupt`` is the user's and passes through.

>>> from schemas.envelope import Record
>>> from schemas.lifecycle import RunStarted
>>> from projections.trace_store import TraceStore
>>> r = Record(12, 0, "hx.trace.r._._", RunStarted.TYPE, 1, 0, RunStarted(run_id="r", kind="run"))
>>> print(fold_failed(TraceStore(), r, SystemExit(0)))  # doctest: +NORMALIZE_WHITESPACE
projection 'trace_store' (projections.trace_store:TraceStore) failed on HX_TRACE seq 12
(hx.trace.r._._, run.started): it called sys.exit(0); nothing was checkpointed from this event on
"""

from __future__ import annotations

from typing import Any

from projections.errors import ProjectionFailed
from schemas.envelope import Record

PROJECTION_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)
"""What a projection's code raising is its own failure (``KeyboardInterrupt`` is the user's: not caught)."""


def named(projection: Any) -> str:
    """``projection 'name' (module:Class)``: which projection, and whose code it is."""
    cls = type(projection)
    return f"projection {getattr(projection, 'name', '?')!r} ({cls.__module__}:{cls.__qualname__})"


def event_at(projection: Any, record: Record) -> str:
    """Where an event is: its stream and sequence (and index in the message), subject and type."""
    index = f", event {record.index} of the message" if record.index else ""
    return f"{projection.stream} seq {record.seq}{index} ({record.subject}, {record.type})"


def raised(exc: BaseException) -> str:
    """An exception as one clause: ``Type: message``, or what ``sys.exit`` was called with."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def fold_failed(projection: Any, record: Record, exc: BaseException) -> ProjectionFailed:
    """The fold raised (or exited) on ``record``."""
    return ProjectionFailed(f"{named(projection)} failed on {event_at(projection, record)}: {raised(exc)}; "
                            "nothing was checkpointed from this event on")


def encode_failed(projection: Any, last: Record | None, exc: BaseException) -> ProjectionFailed:
    """The state (after ``last``, or the initial one) cannot be encoded for a checkpoint or a snapshot."""
    when = f"after {event_at(projection, last)}, the last event folded," if last is not None else "(the initial one)"
    return ProjectionFailed(f"{named(projection)}: its state {when} cannot be encoded: {raised(exc)}; "
                            "nothing was checkpointed past the last state that could")


def call_failed(projection: Any, what: str, exc: BaseException) -> ProjectionFailed:
    """Another of the projection's methods (``initial()``, ``summary()``) raised or exited."""
    return ProjectionFailed(f"{named(projection)}: {what} failed: {raised(exc)}")
