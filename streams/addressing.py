"""Trace subjects against bodies: an event on ``HX_TRACE`` must be where its body says it belongs.

Folds key task history by the body (``run_id``, ``round``, ``task_id``, ``attempt``) and the
trace store by the subject, so a message whose two disagree would be counted twice, or
under the wrong task. A reader therefore quarantines, with the reason:

- a message on a subject that is not a trace address (``hx.trace.x``);
- an event whose ``LEVEL`` (run, round or attempt) is not its subject's level;
- an event whose identity fields disagree with its subject;
- an event on an attempt's channel (``streams.channels``) that is not that channel's type.

The check costs a cached subject parse per message and a dictionary lookup per event.

>>> from schemas.lifecycle import RunStarted
>>> mismatch("hx.trace.r1._._._", RunStarted(run_id="r2"))
"run.started says run_id 'r2', its subject says run 'r1'"
"""

from __future__ import annotations

from functools import lru_cache

from schemas.event import Event
from streams.topology import TraceAddress

_FIELDS = (("run_id", "run"), ("round", "round"), ("task_id", "task"), ("attempt", "attempt"))
"""Body field and the address part it must equal."""
_identity: dict[type[Event], tuple[tuple[str, str], ...]] = {}
_WHOSE = {"run": "a run's", "round": "a round's", "attempt": "an attempt's"}


@lru_cache(maxsize=65_536)
def _parse(subject: str) -> TraceAddress | str:
    try:
        return TraceAddress.parse(subject)
    except ValueError as exc:
        return str(exc)


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` is not a trace address, or None when it is one."""
    parsed = _parse(subject)
    return parsed if isinstance(parsed, str) else None


def _level(addr: TraceAddress) -> str:
    if addr.round is None:
        return "run" if addr.task is None and addr.attempt is None else "malformed"
    if addr.task is None and addr.attempt is None:
        return "round"
    return "attempt" if addr.task is not None and addr.attempt is not None else "malformed"


def mismatch(subject: str, event: Event) -> str | None:
    """Why ``event`` does not belong on trace ``subject``, or None when it does."""
    parsed = _parse(subject)
    if isinstance(parsed, str):
        return parsed
    cls = type(event)
    fields = _identity.get(cls)
    if fields is None:
        fields = _identity[cls] = tuple((f, a) for f, a in _FIELDS if f in cls.__struct_fields__)
    if cls.LEVEL and _level(parsed) != cls.LEVEL:
        return f"{cls.TYPE} belongs on {_WHOSE[cls.LEVEL]} subject, not on {subject!r}"
    if parsed.channel is not None and parsed.channel != cls.CHANNEL:
        return f"{cls.TYPE} does not belong on channel {parsed.channel!r} ({subject!r})"
    for name, part in fields:
        said, where = getattr(event, name), getattr(parsed, part)
        if said != where:
            return f"{cls.TYPE} says {name} {said!r}, its subject says {part} {where!r}"
    return None
