"""The projection runner: fold the log into a state, exactly once per event, resumably.

The runner's position is the (sequence, index-in-frame) of the last event it applied;
an event at or before it is skipped, so replaying a range twice changes nothing.
Checkpoints pair a state snapshot in the object store with the position in the KV
bucket (snapshot first, position second): a runner killed at any moment restarts
from its last checkpoint and reaches the same state as one that never stopped.

A runner reads only its projection's ``reads`` (the log decodes no other body, and serves a
trace read of only summary types from their channels), a fetch's records at a time. It
checkpoints every ``checkpoint_every`` events when given that; otherwise every
``CHECKPOINT_EVERY`` events, or less often when its last snapshot was large
(``EVENTS_PER_SNAPSHOT_BYTE``): each checkpoint stores the whole state.

Time travel (``as_of``) folds a fresh runner up to a position from the nearest sound as-of
snapshot (``projections.snapshots``) or checkpoint at or before it, stores the snapshot at
the last multiple of ``snapshot_every`` on its way, and never writes the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
import nats.errors
from nats.js.errors import KeyNotFoundError, NotFoundError, ObjectNotFoundError

from projections.base import Projection
from projections.errors import AsOfError, ProjectionFailed
from projections.failures import PROJECTION_FAILURES, call_failed, encode_failed, fold_failed
from projections.snapshots import SNAPSHOT_EVERY, Snapshots, put_blob
from schemas.envelope import Record
from streams.log import EventLog
from streams.topology import BLOB_STORE, POSITIONS_BUCKET

S = TypeVar("S")
LogPosition = tuple[int, int]
START: LogPosition = (0, 0)
_WHOLE = 2**31
"""A frame index past any real one: a snapshot at sequence ``s`` holds every event of message ``s``."""
CHECKPOINT_EVERY = 50_000
"""Events between two checkpoints of a runner not told otherwise, at least (``EVENTS_PER_SNAPSHOT_BYTE``)."""
EVENTS_PER_SNAPSHOT_BYTE = 1 / 32
"""A runner not told how often to checkpoint takes at least this many events per byte of its last snapshot.

A checkpoint encodes, hashes and stores the whole state, a fold costs per event: with a fixed
count, a state growing with the log is re-encoded ever more often for its size (the rebuild goes
quadratic); spaced by its size, the checkpoints of a large state stay a bounded share of the fold.
Measured: a checkpoint costs ~10-16 ns a snapshot byte, a full fold ~4.5 us an event, so 32 bytes
an event keeps checkpoints under ~10 % of a rebuild."""


class Checkpoint(msgspec.Struct, frozen=True):
    """What the KV bucket holds for one projection."""

    seq: int
    index: int
    version: int
    applied: int
    snapshot: str
    """Object-store name of the state snapshot."""
    digest: str


@dataclass
class AsOfFold(Generic[S]):
    """A projection's state as of a position, and what folding it cost."""

    state: S
    position: LogPosition
    digest: str
    start: int
    """The sequence the fold started after (0: the log's beginning)."""
    start_kind: str
    """``start``, ``snapshot``, ``checkpoint`` or ``runner`` (the runner's own state)."""
    folded: int
    """Events applied by this fold."""
    written: int
    """As-of snapshots this fold stored."""


class ProjectionRunner(Generic[S]):
    """Keeps one projection's state and position, on the log's KV bucket and object store."""

    def __init__(self, log: EventLog, projection: Projection[S], *, checkpoint_every: int | None = None,
                 batch: int = 1000, snapshot_every: int = SNAPSHOT_EVERY) -> None:
        self.log = log
        self.projection = projection
        self.checkpoint_every = checkpoint_every or CHECKPOINT_EVERY
        """Events between two checkpoints: exactly, when given; when not, at least (spaced by the state's size)."""
        self.spaced = checkpoint_every is None
        self.batch = batch
        self.snapshot_every = snapshot_every
        """Stream messages between two as-of snapshots (``as_of`` stores them at its multiples)."""
        self.state: S = self._initial()
        self.position: LogPosition = START
        self.applied = 0
        """Events applied to ``state`` since the initial state."""
        self.resumed_from: LogPosition | None = None
        """The checkpoint position ``load`` restored, if any."""
        self.last: Record | None = None
        """The last record folded into ``state`` (what an encoding failure names)."""
        self.failure: ProjectionFailed | None = None
        """Set when the fold failed: the state is spoiled (a fold may have half-updated it) and never checkpointed."""
        self.snapshot_bytes = 0
        """Size of the last snapshot stored or loaded: the next checkpoint waits for the fold to pay for it."""

    def _initial(self) -> S:
        try:
            return self.projection.initial()
        except PROJECTION_FAILURES as exc:  # a projection's own failure (any exception, or its sys.exit)
            raise call_failed(self.projection, "initial()", exc) from exc

    @property
    def digest(self) -> str:
        """Canonical digest of the current state (``ProjectionFailed`` when it cannot be encoded)."""
        try:
            return self.projection.digest(self.state)
        except PROJECTION_FAILURES as exc:  # encoding a state is the projection's own code
            raise encode_failed(self.projection, self.last, exc) from exc

    def encoded(self) -> tuple[bytes, str]:
        """The state's snapshot bytes and its digest; ``ProjectionFailed`` (and nothing written) when it cannot be."""
        if self.failure is not None:
            raise self.failure
        try:
            data = self.projection.encode(self.state)
            return data, self._digest_of(data)
        except PROJECTION_FAILURES as exc:  # encoding a state is the projection's own code
            raise encode_failed(self.projection, self.last, exc) from exc

    # --- folding ------------------------------------------------------------------------

    def apply(self, record: Record) -> bool:
        """Fold one record unless it is at or before the position; return whether it applied."""
        pos = (record.seq, record.index)
        if pos <= self.position:
            return False
        reads = self.projection.reads
        if not reads or record.type in reads:
            try:
                self.state = self.projection.fold(self.state, record)
            except PROJECTION_FAILURES as exc:  # a projection's own failure (any exception, or its sys.exit)
                self.failure = fold_failed(self.projection, record, exc)
                raise self.failure from exc
            self.applied += 1
            self.last = record
        self.position = pos
        return True

    def _fold_run(self, records: Sequence[Record], lo: int, limit: int) -> tuple[int, int]:
        """Apply ``records[lo:]`` in order, as ``apply`` would each, until ``limit`` were taken; return where it
        stopped and how many it took (the records after the position).

        The read's tight loop: records come in log order, so only a prefix can lie at or before
        the position (a resumed read starts in the message it stopped in), and each one after it
        is folded without the per-record bookkeeping of ``apply``; the position, count and last
        record are set once, or at the record whose fold failed.
        """
        end = len(records)
        position = self.position
        while lo < end and (records[lo].seq, records[lo].index) <= position:
            lo += 1
        hi = min(end, lo + limit)
        if lo >= hi:
            return lo, 0
        reads = self.projection.reads
        fold = self.projection.fold
        state, applied, last = self.state, self.applied, self.last
        i = lo
        try:
            for i in range(lo, hi):
                record = records[i]
                if reads and record.type not in reads:
                    continue
                state = fold(state, record)
                applied += 1
                last = record
        except PROJECTION_FAILURES as exc:  # a projection's own failure (any exception, or its sys.exit)
            self.state, self.applied, self.last = state, applied, last
            if i > lo:
                self.position = (records[i - 1].seq, records[i - 1].index)
            self.failure = fold_failed(self.projection, records[i], exc)
            raise self.failure from exc
        self.state, self.applied, self.last = state, applied, last
        self.position = (records[hi - 1].seq, records[hi - 1].index)
        return hi, hi - lo

    def _checkpoint_due(self) -> int:
        """Events to take after a checkpoint before the next: ``checkpoint_every``, or more for a large state.

        Unless told how often, a checkpoint (which encodes, hashes and stores the whole state) waits
        until the events folded since the last one pay for its snapshot's bytes (``EVENTS_PER_SNAPSHOT_BYTE``).
        """
        if not self.spaced:
            return self.checkpoint_every
        return max(self.checkpoint_every, int(self.snapshot_bytes * EVENTS_PER_SNAPSHOT_BYTE))

    async def catch_up(self, stop: int | None = None, progress: Callable[[int, int], None] | None = None, *,
                       checkpoint: bool = True) -> S:
        """Apply every event after the position up to ``stop`` (default: the log's end now).

        Only the projection's ``reads`` are read (the log decodes no other body, and serves a read of
        only summary types by subject filters). With ``checkpoint`` false the caller checkpoints when
        it chooses (a learner does, after its record: the buffer's checkpoint then always matches a pass).
        """
        proj = self.projection
        last = await self.log.last_seq(proj.stream)
        stop = last if stop is None else min(stop, last)
        per_record = type(self).apply is not ProjectionRunner.apply  # a runner that extends apply sees each record
        since, due = 0, self._checkpoint_due()
        async for chunk in self.log.read_chunks(proj.stream, start=self.position[0] or 1, stop=stop,
                                                subjects=proj.subjects, types=proj.reads, batch=self.batch):
            at = 0
            while at < len(chunk):
                if per_record:
                    taken = int(self.apply(chunk[at]))
                    at += 1
                else:
                    at, taken = self._fold_run(chunk, at, due - since)
                since += taken
                if since >= due:
                    await self.checkpoint()
                    since, due = 0, self._checkpoint_due()
            if progress is not None:
                progress(self.position[0], stop)
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
        since, due = 0, self._checkpoint_due()
        stream = self.log.subscribe(self.projection.stream, start=self.position[0] or 1,
                                    subjects=self.projection.subjects, types=self.projection.reads,
                                    batch=self.batch, until=until)
        try:
            async for record in stream:
                if self.apply(record):
                    since += 1
                    if since >= due:
                        await self.checkpoint()
                        since, due = 0, self._checkpoint_due()
                if until is not None and until.is_set():
                    break
        finally:
            await stream.aclose()
            if self.failure is None:  # a spoiled state is never checkpointed
                await self.checkpoint()

    async def rebuild(self, progress: Callable[[int, int], None] | None = None) -> S:
        """Fold the whole log again from sequence 0 (``restart``): its checkpoints replace the stored one."""
        self.restart()
        return await self.catch_up(progress=progress)

    def restart(self) -> None:
        """Start over from the initial state, in memory; the stored checkpoint stays until this runner's next one.

        A fold that then fails leaves the stored checkpoint as it was (``reset`` deletes it at once).
        """
        self.state, self.position, self.applied = self._initial(), START, 0
        self.resumed_from, self.last, self.failure, self.snapshot_bytes = None, None, None, 0

    async def as_of(self, position: int) -> S:
        """The state as of stream sequence ``position`` (inclusive); this runner and its checkpoint are untouched."""
        return (await self.fold_as_of(position)).state

    async def fold_as_of(self, position: int, *, keep: bool = True) -> AsOfFold[S]:
        """``as_of`` and what it cost: folded from the nearest sound start at or before ``position``.

        The start is the nearest of: this runner's own state (copied) when its position is at
        or before ``position``, its stored checkpoint, and a sound as-of snapshot; else
        sequence 1. With ``keep`` the fold stores one as-of snapshot, at the last multiple of
        ``snapshot_every`` at or before ``position`` when it starts before it, for the folds
        after it. The checkpoint is read (a start point), never written.
        """
        stream = self.projection.stream
        last = await self.log.last_seq(stream)
        if not 0 <= position <= last:
            raise AsOfError(f"position {position} is not on {stream} (sequences 1..{last})")
        here = self.position[0] if self.position > START and self.position[0] <= position else 0
        # Copied now, before any await: a runner following the log may move on while we read snapshots.
        # The copy keeps its key order (a snapshot's canonical encoding would sort the keys) and its
        # shared parts shared.
        mine = (copy.deepcopy(self.state), self.position, self.applied) if here else None
        fresh = self._fresh()
        snapshots = Snapshots(self.log, self.projection)
        start, kind = 0, "start"
        found = await snapshots.load(position, above=here)
        if found is not None:
            ref, state = found
            fresh.state, fresh.position, fresh.applied = state, (ref.seq, _WHOLE), ref.applied
            start, kind = ref.seq, "snapshot"
        cp = await self._read_checkpoint()
        if cp is not None and cp.version == self.projection.version and max(start, here) < cp.seq <= position:
            probe = self._fresh()
            await probe.load()
            if probe.resumed_from is not None:  # a checkpoint that verifies: start from it
                fresh, start, kind = probe, cp.seq, "checkpoint"
        if mine is not None and here >= start:  # the runner itself is nearest (no snapshot or checkpoint is)
            fresh.state, fresh.position, fresh.applied = mine
            start, kind = here, "runner"
        before, written = fresh.applied, 0
        boundary = position // self.snapshot_every * self.snapshot_every
        if keep and boundary > start:
            # One snapshot per fold, the nearest below the position: a fold then costs a rebuild stopped at
            # the position plus one write (writing every boundary passed cost more than it saved when
            # measured), and repeated folds near a point start from it.
            await fresh.catch_up(stop=boundary, checkpoint=False)
            await snapshots.put(boundary, fresh.applied, *fresh.encoded())
            written = 1
        await fresh.catch_up(stop=position, checkpoint=False)
        return AsOfFold(fresh.state, fresh.position, fresh.digest, start, kind, fresh.applied - before, written)

    def _fresh(self) -> ProjectionRunner[S]:
        """A runner of the same projection at the start that never checkpoints: time travel folds in it."""
        return ProjectionRunner(self.log, self.projection, checkpoint_every=sys.maxsize, batch=self.batch,
                                snapshot_every=self.snapshot_every)

    # --- checkpoints --------------------------------------------------------------------

    def _snapshot_name(self, pos: LogPosition) -> str:
        return f"projection/{self.projection.name}/v{self.projection.version}/{pos[0]}.{pos[1]}"

    async def checkpoint(self) -> Checkpoint:
        """Store the state snapshot, then point the position at it; drop the previous snapshot."""
        kv = await self.log.js.key_value(POSITIONS_BUCKET)
        previous = await self._read_checkpoint()
        name = self._snapshot_name(self.position)
        data, digest = self.encoded()  # before anything is written: a state that cannot be encoded writes nothing
        # Always (re)write the snapshot: one stored under this name may be torn or missing.
        await put_blob(self.log, name, data)
        self.snapshot_bytes = len(data)
        cp = Checkpoint(self.position[0], self.position[1], self.projection.version, self.applied, name, digest)
        await kv.put(self.projection.name, msgspec.msgpack.encode(cp))
        if previous is not None and previous.snapshot != name:
            store = await self.log.js.object_store(BLOB_STORE)
            with contextlib.suppress(NotFoundError, ObjectNotFoundError):
                await store.delete(previous.snapshot)
        return cp

    def _digest_of(self, snapshot: bytes) -> str:
        """``state_digest(self.state)``, hashed from the snapshot when it is that same canonical encoding.

        The base ``Projection.encode`` is ``state_digest``'s encoding, so its snapshot bytes hash to the
        digest: a checkpoint then encodes a large state once instead of twice.
        """
        if getattr(self.projection.encode, "__func__", None) is Projection.encode and \
                getattr(self.projection.digest, "__func__", None) is Projection.digest:
            return hashlib.sha256(snapshot).hexdigest()
        return self.projection.digest(self.state)

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

    async def load(self) -> LogPosition:
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
        except PROJECTION_FAILURES as exc:  # a projection's own decode() failing (any exception, or its sys.exit)
            raise call_failed(self.projection, "decode() of its checkpoint", exc) from exc
        if self.projection.digest(state) != cp.digest:
            return self.position  # a torn snapshot is never trusted
        self.state, self.position, self.applied = state, (cp.seq, cp.index), cp.applied
        self.resumed_from, self.snapshot_bytes = self.position, len(obj.data or b"")
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
        self.restart()
