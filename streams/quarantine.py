"""Where undecodable messages go: skipped by readers, kept with the reason, and counted."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("hx.streams")


@dataclass(frozen=True)
class Quarantined:
    """One message a reader could not decode, and why."""

    stream: str
    subject: str
    seq: int
    reason: str
    type: str | None
    size: int
    index: int | None = None
    """The event's position in its frame, when one event of a message was quarantined and not the message."""


@dataclass
class Quarantine:
    """The undecodable messages a reader met: the last ``keep`` in full, all of them counted."""

    keep: int = 1000
    count: int = 0
    records: deque[Quarantined] = field(default_factory=deque)

    def add(self, record: Quarantined) -> None:
        """Record one undecodable message and warn once per message."""
        self.count += 1
        self.records.append(record)
        while len(self.records) > self.keep:
            self.records.popleft()
        where = {} if record.index is None else {"index": record.index}
        log.warning("message quarantined" if record.index is None else "event quarantined", stream=record.stream,
                    subject=record.subject, seq=record.seq, **where, reason=record.reason)
