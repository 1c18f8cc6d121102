"""Which subjects a trace read asks the server for: narrow reads skip the attempts' bulk on the server.

An attempt's events are framed on its subject, ``hx.trace.<run>.<round>.<task>.<attempt>``,
except its summary events (``Event.CHANNEL``: ``attempt.started``, ``verifier.score``,
``attempt.finished``), each written in a message of its own on the attempt's subject plus its
channel token (``....<attempt>.finished``). Run- and round-level events are on subjects whose
task and attempt tokens are ``_``. So a read of only summary and run- or round-level types can
be served by subject filters that never match an attempt's bulk frames: for 3,000 attempts
that is a few thousand small messages instead of ten thousand frames of 4M events.

The log stays one log. The tracer sends an attempt's messages one after the other, each only
once the previous one is stored, whatever its subject, so the stream's sequence is the
attempt's own order across its subjects: a reader of everything merges nothing.

A stream holds this layout from the sequence in its ``layout`` marker on (``streams.layout``;
written when hx first opens the stream as a writer). Before it, summary events may be inside
the bulk frames (logs written before the channels existed), so a read of that range keeps the
bulk filters (``complete``) and only the part from the marker on is narrowed (``narrowed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from schemas.errors import SchemaError
from schemas.event import Event, event_type
from streams.topology import NO_TOKEN

TRACE_ALL = "hx.trace.>"


@lru_cache(maxsize=1024)
def channel_of(type_name: str) -> str:
    """The channel an event type is written on (empty: the attempt's frames, or not an attempt's event)."""
    try:
        return event_type(type_name).CHANNEL
    except SchemaError:
        return ""


def _level_of(type_name: str) -> str:
    try:
        return event_type(type_name).LEVEL
    except SchemaError:
        return ""


@lru_cache(maxsize=65_536)
def is_attempt_subject(subject: str) -> bool:
    """True for an attempt's own trace subject (six tokens, task and attempt named)."""
    parts = subject.split(".")
    return len(parts) == 6 and parts[:2] == ["hx", "trace"] and NO_TOKEN not in parts[3:] and \
        not any(w in parts for w in ("*", ">"))


@lru_cache(maxsize=65_536)
def attempt_subject(subject: str) -> str:
    """The attempt's own subject of a message subject: a channel's without its last token, any other as it is.

    Records carry it (``Record.subject``), so a reader groups an attempt's events by one subject
    whichever message held them; the event's type says which channel it came on.
    """
    parts = subject.split(".")
    if len(parts) == 7 and parts[:2] == ["hx", "trace"]:
        return subject.rpartition(".")[0]
    return subject


def routed(subject: str, event: Event) -> str:
    """Where ``event`` goes when appended to ``subject``: an attempt's summary event, on its channel."""
    channel = type(event).CHANNEL
    return f"{subject}.{channel}" if channel and is_attempt_subject(subject) else subject


def misplaced(subject: str, types: Iterable[str]) -> str | None:
    """Why a frame of ``types`` may not go on ``subject`` as one message (None: it may)."""
    if not is_attempt_subject(subject):
        return None
    found = sorted({t for t in types if channel_of(t)})
    if found:
        return (f"a frame on attempt subject {subject!r} holds {', '.join(found)}, which go in messages of their "
                "own on the attempt's channels (streams.channels): append them singly or in a batch")
    return None


def _tokens(pattern: str) -> list[str] | None:
    """The six tokens of a trace pattern (``hx.trace.>`` read as every token ``*``); None for any other."""
    if pattern == TRACE_ALL:
        return ["hx", "trace", "*", "*", "*", "*"]
    parts = pattern.split(".")
    if len(parts) == 6 and parts[:2] == ["hx", "trace"] and ">" not in parts:
        return parts
    return None


def complete(subjects: Sequence[str]) -> list[str]:
    """Filters that match what ``subjects`` matched before channels existed, plus the channels of its attempts.

    A six-token attempt pattern gains its channel companion (``<pattern>.*``), which cannot overlap
    it (another token count), so the server still serves every event of those attempts.
    """
    out: list[str] = []
    for subject in subjects or (TRACE_ALL,):
        out.append(subject)
        parts = _tokens(subject)
        if parts is not None and subject != TRACE_ALL and parts[4] != NO_TOKEN and parts[5] != NO_TOKEN:
            out.append(f"{subject}.*")
    return list(dict.fromkeys(out))


def narrowed(subjects: Sequence[str], types: Iterable[str]) -> list[str] | None:
    """Filters that match only the summary and run- or round-level events of ``types`` within ``subjects``.

    None when some type is written in the attempts' frames (or ``types`` is empty, or a subject is
    not a plain trace pattern): such a read needs ``complete`` filters.
    """
    wanted = sorted(set(types))
    if not wanted:
        return None
    channels = sorted({c for t in wanted if (c := channel_of(t))})
    above = any(_level_of(t) in ("run", "round") for t in wanted)
    if any(not channel_of(t) and _level_of(t) not in ("run", "round") for t in wanted):
        return None
    out: list[str] = []
    for subject in subjects or (TRACE_ALL,):
        parts = _tokens(subject)
        if parts is None:
            return None
        run, rnd, task, attempt = parts[2:]
        if task != NO_TOKEN and attempt != NO_TOKEN:
            out += [f"hx.trace.{run}.{rnd}.{task}.{attempt}.{c}" for c in channels]
        if above and task in ("*", NO_TOKEN) and attempt in ("*", NO_TOKEN):
            out.append(f"hx.trace.{run}.{rnd}.{NO_TOKEN}.{NO_TOKEN}")
    return list(dict.fromkeys(out)) or None


def segments(start: int, stop: int, subjects: Sequence[str], types: Iterable[str],
             first_channel_seq: int | None) -> list[tuple[int, int, list[str]]]:
    """The ranges of a trace read and the filters of each: in full before the marker, narrowed from it on."""
    full = complete(subjects)
    narrow = narrowed(subjects, types) if first_channel_seq is not None else None
    if narrow is None or first_channel_seq is None:
        return [(start, stop, full)]
    out: list[tuple[int, int, list[str]]] = []
    if start < first_channel_seq:
        out.append((start, min(stop, first_channel_seq - 1), full))
    if stop >= first_channel_seq:
        out.append((max(start, first_channel_seq), stop, narrow))
    return out
