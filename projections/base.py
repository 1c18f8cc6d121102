"""What a projection is: a deterministic fold of log records into a read model.

A projection declares the stream and event types it reads, its initial state and its
fold. The runner owns the state: a fold may update it in place (1M-event rebuilds
cannot afford a copy per event) and returns it, but it must depend on nothing but the
state and the record: no I/O, no clock, no randomness. Then a rebuilt state and one
maintained live are identical, which ``state_digest`` checks.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from schemas.envelope import Record
from streams.topology import TRACE

S = TypeVar("S")

_canonical = msgspec.msgpack.Encoder(order="sorted")


def state_digest(state: Any) -> str:
    """A canonical sha256 of a projection state (map keys sorted, so insertion order is irrelevant)."""
    return hashlib.sha256(_canonical.encode(state)).hexdigest()


class Projection(Generic[S]):
    """A read model folded from the log; subclasses set the class attributes and two methods."""

    name: ClassVar[str]
    """Unique name, also the key of its position in the KV bucket."""
    version: ClassVar[int] = 1
    """Bump when the fold changes: checkpoints of another version are discarded and rebuilt."""
    stream: ClassVar[str] = TRACE.name
    reads: ClassVar[frozenset[str]] = frozenset()
    """Event types the fold reads; empty means all."""
    subjects: ClassVar[tuple[str, ...]] = ()
    """Subject filters on the stream; empty means all."""
    state_type: ClassVar[Any]
    """The msgspec-decodable type of the state, for checkpoints."""

    def initial(self) -> S:
        """The state before any event."""
        raise NotImplementedError

    def fold(self, state: S, record: Record) -> S:
        """Apply one record; return the new state."""
        raise NotImplementedError

    def encode(self, state: S) -> bytes:
        """Serialise a state for a checkpoint."""
        return _canonical.encode(state)

    def digest(self, state: S) -> str:
        """The canonical digest of a state (``state_digest``; a projection whose state that cannot encode overrides
        it, with ``encode``)."""
        return state_digest(state)

    def decode(self, data: bytes) -> S:
        """Restore a state from a checkpoint."""
        result: S = msgspec.msgpack.decode(data, type=self.state_type)
        return result
