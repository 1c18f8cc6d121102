"""Conversations on the log, each stored as a delta against the one before it in its attempt.

A step carries its conversation in up to seven events: the step_start, before_model
and step_end hook records (as emitted and as returned) and the model request. Each of
these is mostly the previous one, plus a few messages or minus a trimmed window.
Logging each in full makes an attempt's trace grow with the square of its length
(about 56 KB per step on a 25-message text game), and the log writer's cost with it.

So the tracer logs a conversation as a ``History``: ``ordinal`` numbers the
conversations of the attempt (0, 1, ...), and ``parts`` rebuild it from the previous
one (``ordinal - 1``), in order. A part is either a span ``[start, stop)`` of that
previous conversation or a literal ``Message``. The event's own ``messages`` field is
empty on the log while ``history`` is set.

Readers that need the messages pass an attempt's records, in log order, through
``resolve`` (or a ``HistoryResolver``), which puts the full conversation back and
clears ``history``. A record whose base conversation was not read (a read that starts
mid-attempt, or one filtered by type) raises ``HistoryGap`` naming subject and
sequence, rather than yielding a wrong conversation.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence

import msgspec

from schemas.envelope import Record
from schemas.errors import HistoryGap
from schemas.event import Event
from schemas.hooks import BeforeModel, HookRecord, StepEnd, StepStart
from schemas.lifecycle import AttemptFinished
from schemas.messages import History, Message, Part
from schemas.model import ModelRequest

_replace = msgspec.structs.replace
_CONVERSATION_HOOKS = (StepStart, BeforeModel, StepEnd)


def diff(base: Sequence[Message], messages: Sequence[Message]) -> tuple[Part, ...]:
    """The parts that rebuild ``messages`` from ``base`` (spans where they agree, literals elsewhere)."""
    n = len(base)
    if n and len(messages) >= n and tuple(messages[:n]) == tuple(base):
        # The common case (the same conversation, or it plus new messages), compared in C: tuple
        # equality tests identity before ==, and the loop hands the same message objects along.
        return ((0, n), *messages[n:])
    parts: list[Part] = []
    j = 0  # where in base the next message is expected
    start = -1  # start of the open span, -1 when none is open
    for m in messages:
        if j < n and (base[j] is m or base[j] == m):
            if start < 0:
                start = j
            j += 1
            continue
        if start >= 0:
            parts.append((start, j))
            start = -1
        # Only a mismatch inside the base (a trimmed window, an edited message) is worth a search;
        # past the base's end every message is new.
        k = _find(base, m) if j < n else -1
        if k >= 0:
            start, j = k, k + 1
        else:
            parts.append(m)
    if start >= 0:
        parts.append((start, j))
    return tuple(parts)


def _find(base: Sequence[Message], m: Message) -> int:
    for k, b in enumerate(base):
        if b is m or b == m:
            return k
    return -1


def apply(base: Sequence[Message], parts: Iterable[Part]) -> tuple[Message, ...]:
    """The conversation ``parts`` describe on top of ``base``; ``HistoryGap`` if a span lies outside it."""
    out: list[Message] = []
    n = len(base)
    for part in parts:
        if isinstance(part, Message):
            out.append(part)
            continue
        a, b = part
        if not 0 <= a < b <= n:
            raise HistoryGap(f"span [{a}, {b}) lies outside the previous conversation of {n} messages")
        out.extend(base[a:b])
    return tuple(out)


def conversation(event: Event) -> tuple[Message, ...] | None:
    """The messages ``event`` carries as a conversation (None for an event without one)."""
    if type(event) is HookRecord:
        hook = event.event
        return hook.messages if isinstance(hook, _CONVERSATION_HOOKS) else None
    if type(event) is ModelRequest:
        return event.messages
    return None


def packed(event: Event) -> History | None:
    """The ``History`` an event was logged with (None: it carries its messages in full, or none)."""
    if type(event) is HookRecord or type(event) is ModelRequest:
        return event.history
    return None


def _with_conversation(event: Event, messages: tuple[Message, ...], history: History | None) -> Event:
    """A conversation-bearing ``event`` (see ``conversation``) with its messages and history replaced."""
    if type(event) is HookRecord:
        return _replace(event, event=_replace(event.event, messages=messages), history=history)
    return _replace(event, messages=messages, history=history)


class HistoryPacker:
    """Writer side, one per attempt: replaces each conversation in full with its delta."""

    def __init__(self) -> None:
        self.base: tuple[Message, ...] = ()
        self.ordinal = 0

    def pack(self, event: Event) -> Event:
        """``event`` as it goes on the log: its conversation as a ``History`` (other events unchanged)."""
        messages = conversation(event)
        if messages is None or packed(event) is not None:
            return event
        return _with_conversation(event, (), self._delta(messages))

    def _delta(self, messages: tuple[Message, ...]) -> History:
        history = History(ordinal=self.ordinal, parts=diff(self.base, messages))
        self.base, self.ordinal = messages, self.ordinal + 1
        return history


class HistoryResolver:
    """Reader side: puts full conversations back into records read in log order, per attempt subject."""

    def __init__(self, *, strict: bool = True) -> None:
        self.strict = strict
        """Raise ``HistoryGap`` on an unresolvable record (False: pass it on still packed)."""
        self._last: dict[str, tuple[int, tuple[Message, ...]]] = {}

    def resolve(self, record: Record) -> Record:
        """``record`` with its conversation in full (records without one pass unchanged)."""
        event = record.event
        history = packed(event)
        if history is None:
            if type(event) is AttemptFinished:
                self._last.pop(record.subject, None)  # the attempt's last event: its conversations are done
            return record
        if history.ordinal == 0:
            base: tuple[Message, ...] = ()
        else:
            ordinal, base = self._last.get(record.subject, (-1, ()))
            if ordinal != history.ordinal - 1:
                return self._gap(record, f"conversation {history.ordinal} is a delta against conversation "
                                         f"{history.ordinal - 1} of its attempt, which was not read before it")
        try:
            messages = apply(base, history.parts)
        except HistoryGap as exc:
            return self._gap(record, str(exc))
        self._last[record.subject] = (history.ordinal, messages)
        return _replace(record, event=_with_conversation(event, messages, None))

    def _gap(self, record: Record, reason: str) -> Record:
        if self.strict:
            raise HistoryGap(f"{record.type} at subject {record.subject!r}, sequence {record.seq} "
                             f"(frame index {record.index}): {reason}")
        return record


def resolve(records: Iterable[Record], *, strict: bool = True) -> Iterator[Record]:
    """``records`` (in log order) with every conversation in full."""
    resolver = HistoryResolver(strict=strict)
    for record in records:
        yield resolver.resolve(record)


async def resolve_async(records: AsyncIterable[Record], *, strict: bool = True) -> AsyncIterator[Record]:
    """``resolve`` for records as a log read yields them."""
    resolver = HistoryResolver(strict=strict)
    async for record in records:
        yield resolver.resolve(record)
