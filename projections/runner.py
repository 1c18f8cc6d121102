"""The projection runner: fold the log into a state, exactly once per event, resumably.

The runner's position is the (sequence, index-in-frame) of the last event it applied;
an event at or before it is skipped, so replaying a range twice changes nothing.
Checkpoints pair a state snapshot in the object store with the position in the KV
bucket (snapshot first, position second): a runner killed at any moment restarts
from its last checkpoint and reaches the same state as one that never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec
import nats.errors
from nats.js.api import ObjectMeta, ObjectMetaOptions
from nats.js.errors import KeyNotFoundError, NotFoundError, ObjectNotFoundError

from projections.base import Projection, state_digest
from schemas.envelope import Record
from streams.log import EventLog
from streams.topology import BLOB_STORE, POSITIONS_BUCKET

S = TypeVar("S")
Position = tuple[int, int]
SNAPSHOT_CHUNK = 1024 * 1024
"""Object-store chunk size of snapshots (capped by the server's max payload). nats-py sends an
object's chunks one acknowledged publish at a time, 128 KiB each by default: 1 MiB chunks cut
a multi-megabyte snapshot's round trips eightfold (a 7 MB put: ~60-100 ms down to ~30 ms)."""
START: Position = (0, 0)


class Checkpoint(msgspec.Struct, frozen=True):
    """What the KV bucket holds for one projection."""

    seq: int
    index: int
    version: int
    applied: int
    snapshot: str
    """Object-store name of the state snapshot."""
    digest: str


class ProjectionRunner(Generic[S]):
    """Keeps one projection's state and position, on the log's KV bucket and object store."""

    def __init__(self, log: EventLog, projection: Projection[S], *, checkpoint_every: int = 200_000,
                 batch: int = 1000) -> None:
        self.log = log
        self.projection = projection
        self.checkpoint_every = checkpoint_every
        self.batch = batch
        self.state: S = projection.initial()
        self.position: Position = START
        self.applied = 0
        """Events applied to ``state`` since the initial state."""
        self.resumed_from: Position | None = None
        """The checkpoint position ``load`` restored, if any."""

    @property
    def digest(self) -> str:
        """Canonical digest of the current state."""
        return state_digest(self.state)

    # --- folding ------------------------------------------------------------------------

    def apply(self, record: Record) -> bool:
        """Fold one record unless it is at or before the position; return whether it applied."""
        pos = (record.seq, record.index)
        if pos <= self.position:
            return False
        reads = self.projection.reads
        if not reads or record.type in reads:
            self.state = self.projection.fold(self.state, record)
            self.applied += 1
        self.position = pos
        return True

    async def catch_up(self, stop: int | None = None, progress: Callable[[int, int], None] | None = None, *,
                       checkpoint: bool = True) -> S:
        """Apply every event after the position up to ``stop`` (default: the log's end now).

        With ``checkpoint`` false the caller checkpoints when it chooses (a learner does, after
        its record: the buffer's checkpoint then always matches a pass).
        """
        last = await self.log.last_seq(self.projection.stream)
        stop = last if stop is None else min(stop, last)
        since_checkpoint = 0
        async for record in self.log.read(self.projection.stream, start=self.position[0] or 1, stop=stop,
                                          subjects=self.projection.subjects, batch=self.batch):
            if self.apply(record):
                since_checkpoint += 1
                if since_checkpoint >= self.checkpoint_every:
                    await self.checkpoint()
                    since_checkpoint = 0
                if progress is not None:
                    progress(record.seq, stop)
        if self.position[0] < stop:
            # Messages after the last matching one were filtered out: the runner has still seen them.
            self.position = (stop, 0)
        if checkpoint:
            await self.checkpoint()
        return self.state

    async def follow(self, until: asyncio.Event | None = None) -> None:
        """Apply events as they arrive, checkpointing periodically, until ``until`` is set.

        ``until`` stops the runner within about a second even while no event arrives; an
        event is folded whole or not at all, and the position is checkpointed on the way out.
        """
        since_checkpoint = 0
        stream = self.log.subscribe(self.projection.stream, start=self.position[0] or 1,
                                    subjects=self.projection.subjects, batch=self.batch, until=until)
        try:
            async for record in stream:
                if self.apply(record):
                    since_checkpoint += 1
                    if since_checkpoint >= self.checkpoint_every:
                        await self.checkpoint()
                        since_checkpoint = 0
                if until is not None and until.is_set():
                    break
        finally:
            await stream.aclose()
            await self.checkpoint()

    async def rebuild(self, progress: Callable[[int, int], None] | None = None) -> S:
        """Forget the checkpoint and fold the whole log from sequence 0."""
        await self.reset()
        return await self.catch_up(progress=progress)

    async def as_of(self, position: int) -> S:
        """The state as of log sequence ``position`` (inclusive), folded afresh; touches no checkpoint."""
        fresh: ProjectionRunner[S] = ProjectionRunner(self.log, self.projection, batch=self.batch)
        async for record in self.log.read(self.projection.stream, start=1, stop=position,
                                          subjects=self.projection.subjects, batch=self.batch):
            fresh.apply(record)
        return fresh.state

    # --- checkpoints --------------------------------------------------------------------

    def _snapshot_name(self, pos: Position) -> str:
        return f"projection/{self.projection.name}/v{self.projection.version}/{pos[0]}.{pos[1]}"

    async def checkpoint(self) -> Checkpoint:
        """Store the state snapshot, then point the position at it; drop the previous snapshot."""
        kv = await self.log.js.key_value(POSITIONS_BUCKET)
        store = await self.log.js.object_store(BLOB_STORE)
        previous = await self._read_checkpoint()
        name = self._snapshot_name(self.position)
        # Always (re)write the snapshot: one stored under this name may be torn or missing.
        data = self.projection.encode(self.state)
        chunk = min(SNAPSHOT_CHUNK, getattr(self.log.nc, "max_payload", 0) or SNAPSHOT_CHUNK)
        await store.put(name, data, meta=ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=chunk)))
        cp = Checkpoint(self.position[0], self.position[1], self.projection.version, self.applied, name,
                        self._digest_of(data))
        await kv.put(self.projection.name, msgspec.msgpack.encode(cp))
        if previous is not None and previous.snapshot != name:
            with contextlib.suppress(NotFoundError, ObjectNotFoundError):
                await store.delete(previous.snapshot)
        return cp

    def _digest_of(self, snapshot: bytes) -> str:
        """``state_digest(self.state)``, hashed from the snapshot when it is that same canonical encoding.

        The base ``Projection.encode`` is ``state_digest``'s encoding, so its snapshot bytes hash to the
        digest: a checkpoint then encodes a large state once instead of twice.
        """
        if getattr(self.projection.encode, "__func__", None) is Projection.encode:
            return hashlib.sha256(snapshot).hexdigest()
        return state_digest(self.state)

    async def _read_checkpoint(self) -> Checkpoint | None:
        kv = await self.log.js.key_value(POSITIONS_BUCKET)
        try:
            entry = await kv.get(self.projection.name)
        except (KeyNotFoundError, NotFoundError):
            return None
        if not entry.value:
            return None
        try:
            return msgspec.msgpack.decode(entry.value, type=Checkpoint)
        except msgspec.DecodeError:
            return None  # an unreadable checkpoint is no checkpoint: rebuild

    async def load(self) -> Position:
        """Restore the last checkpoint (if any, and of this projection version); return the position."""
        cp = await self._read_checkpoint()
        if cp is None or cp.version != self.projection.version:
            return self.position
        store = await self.log.js.object_store(BLOB_STORE)
        try:
            obj = await store.get(cp.snapshot)
        except (NotFoundError, ObjectNotFoundError):
            return self.position  # a checkpoint without its snapshot: start afresh
        try:
            state = self.projection.decode(obj.data or b"")
        except msgspec.DecodeError:
            return self.position  # a corrupted snapshot is never trusted
        if state_digest(state) != cp.digest:
            return self.position  # a torn snapshot is never trusted
        self.state, self.position, self.applied = state, (cp.seq, cp.index), cp.applied
        self.resumed_from = self.position
        return self.position

    async def status(self) -> Checkpoint | None:
        """The stored checkpoint of this projection, if any."""
        return await self._read_checkpoint()

    async def reset(self) -> None:
        """Forget state, position and the stored checkpoint."""
        cp = await self._read_checkpoint()
        kv = await self.log.js.key_value(POSITIONS_BUCKET)
        with contextlib.suppress(KeyNotFoundError, NotFoundError, nats.errors.Error):
            await kv.delete(self.projection.name)
        if cp is not None:
            store = await self.log.js.object_store(BLOB_STORE)
            with contextlib.suppress(NotFoundError, ObjectNotFoundError):
                await store.delete(cp.snapshot)
        self.state = self.projection.initial()
        self.position = START
        self.applied = 0
        self.resumed_from = None
