"""The tracer: an attempt's events, numbered by position and written to the log in frames.

Each event is stamped when it is emitted (``schemas.envelope.Stamp``: wall and monotonic
clocks), and an event that ends a model or tool call (``Event.ENDS``) with the time since the
event that started it (``Event.STARTS``), so the log says when each thing happened and how long
each call took, however the events are later framed. Events are encoded once, when the loop
flushes at the end of a step, and buffered; a
conversation goes on the log as a delta against the attempt's previous one
(``schemas.history``), so a step costs the bytes of its new messages, not of the
whole conversation seven times over. The
buffer goes out as frames on the attempt's subject once it holds ``FRAME_TARGET_BYTES``
or its oldest event has waited ``LINGER_S`` (so a slow agent's steps are on the log as
they end, while a fast one's are batched), and always at the end of the attempt. Each
frame's message id is ``<subject>#<first>+<n>``, the positions of its events in the
attempt, so a retried write is stored once.

``LogWriter`` does not wait for a frame's ack before the attempt goes on: it sends the
frame and waits for that ack only before sending the next frame of the attempt (so
frames stay in order: a lost one is sent again before any later one), and for all of
them when the attempt ends (a flush that writes ``AttemptFinished``, the last event).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

from schemas.envelope import EncodedEvent, Stamp, encoded
from schemas.event import Event
from schemas.history import HistoryPacker
from schemas.lifecycle import AttemptFinished
from schemas.messages import Usage
from schemas.model import ModelResponse
from streams.channels import attempt_subject, is_attempt_subject
from streams.log import EventLog, PendingAppend

MAX_FRAME_BYTES = 512 * 1024
"""Stay well under NATS's default 1 MiB payload limit."""
FRAME_TARGET_BYTES = 256 * 1024
"""A step-end flush writes once this much is buffered (fewer, larger messages: the client's per-message
cost dominates)."""
LINGER_S = 0.05
"""... or once the oldest buffered event is this old, so a live reader sees a slow agent's steps as they end."""
_OVERHEAD = 56
"""Bytes a frame adds per event (type name, version, stamp, array headers), for sizing."""


class TraceWriter(ABC):
    """Where an attempt's frames go."""

    @abstractmethod
    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Store one frame of events atomically under an idempotency key."""

    async def write_encoded(self, subject: str, events: Sequence[Event], bodies: Sequence[EncodedEvent],
                            key: str) -> None:
        """Store one frame whose events are already encoded (``bodies``); by default, ``write``."""
        await self.write(subject, events, key)

    async def settle(self) -> None:  # noqa: B027 - optional: only writers that pipeline need it
        """Wait until every frame written so far is stored (raise if one cannot be)."""


class LogWriter(TraceWriter):
    """Frames onto the event log, pipelined: one message per attempt in flight, in order.

    An attempt's summary events go on its channels (``streams.channels``), in messages of their
    own; the attempt's next message, on whichever subject, is sent once the previous one is
    stored, so the stream's order is the attempt's order across its subjects.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._pending: dict[str, PendingAppend] = {}

    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Send the frame once the subject's previous frame is acknowledged."""
        await self.write_encoded(subject, events, [encoded(e) for e in events], key)

    async def write_encoded(self, subject: str, events: Sequence[Event], bodies: Sequence[EncodedEvent],
                            key: str) -> None:
        """Send the pre-encoded frame once the attempt's previous message is acknowledged."""
        lane = attempt_subject(subject)
        previous = self._pending.pop(lane, None)
        if previous is not None:
            await previous.result()
        self._pending[lane] = await self.log.send_frame(subject, bodies, key=key)

    async def settle(self) -> None:
        """Wait for the ack of every frame in flight (a lost one is sent again, same id)."""
        pending, self._pending = self._pending, {}
        for append in pending.values():
            await append.result()


class NullWriter(TraceWriter):
    """Discards events: for measuring the loop itself (``slots.tracer: none``)."""

    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Do nothing."""


class AttemptTracer:
    """Numbers one attempt's events, encodes each once, and flushes them in frames."""

    def __init__(self, writer: TraceWriter, subject: str) -> None:
        self.writer = writer
        self.subject = subject
        self.count = 0
        """Events emitted so far (the next event's position)."""
        self._buffer: list[Event] = []
        self._stamps: list[Stamp] = []
        self._bodies: list[EncodedEvent] = []
        self._started: dict[str, int] = {}
        """The monotonic time each kind of timed call last started (``Event.STARTS``)."""
        self._bytes = 0
        self._since = 0.0
        """When the oldest event in the buffer was encoded (monotonic seconds)."""
        self._flushed = 0
        self._packer = HistoryPacker()
        self._channels = is_attempt_subject(subject)
        """Summary events (``Event.CHANNEL``) go on their channels: only an attempt's subject has them."""
        self.usage = Usage()
        """The summed usage of the ``model.response`` events emitted so far (what the attempt's calls cost)."""

    def emit(self, event: Event) -> None:
        """Record one event, stamped now (written at a later flush)."""
        wall, mono = time.time_ns(), time.monotonic_ns()
        took = 0
        cls = type(event)
        if cls.ENDS:
            began = self._started.pop(cls.ENDS, None)
            took = mono - began if began is not None else 0
        elif cls.STARTS:
            self._started[cls.STARTS] = mono
        if isinstance(event, ModelResponse):
            self.usage = self.usage.plus(event.usage)
        self._buffer.append(event)
        self._stamps.append(Stamp(wall, mono, took))
        self.count += 1

    def _encode(self) -> None:
        bodies = self._bodies
        pack = self._packer.pack
        stamps = self._stamps
        for i in range(len(bodies), len(self._buffer)):
            item = encoded(pack(self._buffer[i]), stamps[i])
            bodies.append(item)
            self._bytes += len(item[2]) + _OVERHEAD

    async def flush(self) -> None:
        """End of a step: encode what was emitted; write it if enough is buffered, or the attempt ended.

        A flush whose last event is ``AttemptFinished`` writes everything and waits until it is stored.
        """
        if not self._buffer:
            return
        if not self._bodies:
            self._since = time.monotonic()
        self._encode()
        final = isinstance(self._buffer[-1], AttemptFinished)
        if final or self._bytes >= FRAME_TARGET_BYTES or time.monotonic() - self._since >= LINGER_S:
            await self._write_all()
        if final:
            await self.writer.settle()

    async def drain(self) -> None:
        """Write everything emitted so far and wait until it is stored (for tracers outside an attempt)."""
        if self._buffer:
            self._encode()
            await self._write_all()
        await self.writer.settle()

    async def _write_all(self) -> None:
        events, bodies = self._buffer, self._bodies
        self._buffer, self._stamps, self._bodies, self._bytes = [], [], [], 0
        start = size = 0
        channel = ""
        for i, (_, _, body, _) in enumerate(bodies):
            n = len(body) + _OVERHEAD
            here = type(events[i]).CHANNEL if self._channels else ""
            # A summary event goes alone in a message on its channel; bulk events go in frames between them.
            if i > start and (size + n > MAX_FRAME_BYTES or here != channel or here):
                await self._write(events[start:i], bodies[start:i], channel)
                start, size = i, 0
            channel = here
            size += n
        if start < len(bodies):
            await self._write(events[start:], bodies[start:], channel)

    async def _write(self, events: list[Event], bodies: list[EncodedEvent], channel: str) -> None:
        subject = f"{self.subject}.{channel}" if channel else self.subject
        await self.writer.write_encoded(subject, events, bodies, f"{subject}#{self._flushed}+{len(events)}")
        self._flushed += len(events)
