"""The tracer: an attempt's events, numbered by position and written to the log in frames.

Events are buffered and flushed at the end of every step (and of the attempt) as
frames on the attempt's subject. Each frame's message id is ``<subject>#<first>+<n>``,
the positions of its events in the attempt, so a retried flush is stored once and a
replayed attempt produces the same ids.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from schemas.envelope import encode_body
from schemas.event import Event
from streams.log import EventLog

MAX_FRAME_BYTES = 512 * 1024
"""Stay well under NATS's default 1 MiB payload limit."""


class TraceWriter(ABC):
    """Where an attempt's frames go."""

    @abstractmethod
    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Store one frame of events atomically under an idempotency key."""


class LogWriter(TraceWriter):
    """Frames onto the event log."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Append the frame and wait for its ack."""
        await self.log.append_frame(subject, events, key=key)


class NullWriter(TraceWriter):
    """Discards events: for measuring the loop itself (``slots.tracer: none``)."""

    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Do nothing."""


class AttemptTracer:
    """Numbers one attempt's events and flushes them in frames."""

    def __init__(self, writer: TraceWriter, subject: str) -> None:
        self.writer = writer
        self.subject = subject
        self.count = 0
        """Events emitted so far (the next event's position)."""
        self._buffer: list[Event] = []
        self._flushed = 0

    def emit(self, event: Event) -> None:
        """Record one event (written at the next flush)."""
        self._buffer.append(event)
        self.count += 1

    async def flush(self) -> None:
        """Write buffered events as frames no larger than ``MAX_FRAME_BYTES``."""
        buffer, self._buffer = self._buffer, []
        chunk: list[Event] = []
        size = 0
        for event in buffer:
            n = len(encode_body(event)) + 32
            if chunk and size + n > MAX_FRAME_BYTES:
                await self._write(chunk)
                chunk, size = [], 0
            chunk.append(event)
            size += n
        if chunk:
            await self._write(chunk)

    async def _write(self, events: list[Event]) -> None:
        await self.writer.write(self.subject, events, f"{self.subject}#{self._flushed}+{len(events)}")
        self._flushed += len(events)
