"""The event log's write side: ``EventLog`` and its typed, batched, framed and conditional appends.

Appends carry a deterministic ``Nats-Msg-Id`` (the messages and their ids are built in
``streams.outgoing``), so a retried append lands once. Every ack has a timeout: nats-py's
``publish_async`` never resolves a future the server rejected (nats.py issue 985), so a
batch that times out is retried message by message, and what stays unacknowledged is
reported, never silently dropped.

``send_frame`` is the run loop's path: a frame of already encoded events sent without
waiting for its ack (``PendingAppend.result`` waits, and sends a lost one again), deflated
when large (``Hx-Encoding: deflate``; the log's readers inflate it before decoding).

``read``, ``subscribe``, ``last_seq`` and ``last_subject_seq`` keep their place on ``EventLog``,
so a caller holds one object for both sides, but only delegate: the pull consumer, its
fetch sizing and the quarantine of what cannot be read are in ``streams.reading``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, BadRequestError, NotFoundError

from schemas.envelope import MSG_ID, EncodedEvent, Record, Stamp
from schemas.event import Event
from streams import direct, reading
from streams.channels import misplaced, routed, segments
from streams.errors import AppendTimeout, ConcurrencyConflict, LogError, UnacknowledgedAppends
from streams.integrity import Heads
from streams.layout import channels_from
from streams.outgoing import Entry, Outgoing, encoded_frame_message, entry_message, frame_message, pack_frames
from streams.permissions import Refusals
from streams.quarantine import Quarantine
from streams.redaction import known_bytes
from streams.topology import LEDGER, TRACE, stream_of

EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071
LEDGER_PREFIX = "hx.ledger."
_RETRYABLE = (asyncio.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.TimeoutError,
              nats.errors.NoRespondersError, nats.errors.OutboundBufferLimitError,
              nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
              # no stream answered: none covers the subject, or JetStream still recovers from a restart
              nats.js.errors.NoStreamResponseError)


@dataclass(frozen=True)
class Appended:
    """The server's acknowledgement of one stored message."""

    seq: int
    key: str
    duplicate: bool = False


async def _await_ack(out: Outgoing, fut: asyncio.Future[PubAck], deadline: float) -> Appended:
    """``out``'s ack by ``deadline`` (monotonic); a refusal is a ``LogError``, a lost ack (retryable) is re-raised.

    On a retryable error the future is cancelled: that frees nats-py's pending slot, and the
    caller sends the message again under the same id.
    """
    try:
        if not fut.done():
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - time.monotonic()))
        ack = fut.result()
    except APIError as exc:
        raise out.rejected(exc) from exc
    except _RETRYABLE:
        fut.cancel()
        raise
    return Appended(ack.seq, out.key, bool(ack.duplicate))


class PendingAppend:
    """A message sent without waiting for its ack; ``result`` waits for it (and sends it again if it was lost)."""

    def __init__(self, log: EventLog, out: Outgoing, ack: asyncio.Future[PubAck] | None) -> None:
        self._log = log
        self._out = out
        self._ack = ack
        self._deadline = time.monotonic() + log.ack_timeout
        self._done: Appended | None = None

    @property
    def key(self) -> str:
        """The message id."""
        return self._out.key

    async def result(self) -> Appended:
        """The ack; a late, lost or unsent message is published again with the same id (stored once)."""
        if self._done is not None:
            return self._done
        if self._ack is not None:
            try:
                self._done = await _await_ack(self._out, self._ack, self._deadline)
                return self._done
            except _RETRYABLE:
                pass
            self._log.retried += 1
        self._done = await self._log._publish_one(self._out, None)
        return self._done


class EventLog:
    """Typed, idempotent access to hx's JetStream streams."""

    def __init__(self, nc: NATS, js: JetStreamContext, *, ack_timeout: float = 5.0,
                 max_in_flight: int = 512, retries: int = 5, retry_backoff: float = 0.25,
                 heads: Heads | None = None, refusals: Refusals | None = None) -> None:
        self.nc = nc
        self.js = js
        self.heads = heads
        """Where stream heads are kept; a ledger append moves the ledger's head (``streams.integrity``)."""
        self.gone: LogError | None = None
        """Set when the server is known to be gone for good: every later append raises it at once."""
        self.ack_timeout = ack_timeout
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.quarantine = Quarantine()
        """What this log's reads skipped as unreadable, with the reason (``streams.reading``)."""
        self.retried = 0
        """How many message appends were sent again after a lost or late ack."""
        self.refusals = refusals or Refusals()
        """Permission violations the server reported: an append it refused fails at once on it, not retried."""
        self.direct = False
        """Read with batched direct gets, creating no consumer (the auditor's connection: ``streams.direct``)."""
        self._layouts: dict[str, int] = {}
        """Each stream's first sequence with summary events on channels, once read (``streams.layout``)."""

    # --- appends ---------------------------------------------------------------------

    async def append(self, subject: str, event: Event, *, key: str | None = None,
                     expected_last_seq: int | None = None) -> Appended:
        """Append one event and wait for its ack; with ``expected_last_seq``, only if the subject is there."""
        out = entry_message(Entry(routed(subject, event), event, key), Stamp.now())
        if expected_last_seq is not None:
            out.headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_seq)
        return await self._publish_one(out, expected_last_seq)

    async def append_frame(self, subject: str, events: Sequence[Event], *, key: str | None = None,
                           expected_last_seq: int | None = None) -> Appended:
        """Append several events as one message: stored together or not at all."""
        if not events:
            raise ValueError("a frame needs at least one event")
        if (why := misplaced(subject, [type(e).TYPE for e in events])) is not None:
            raise LogError(why)
        out = frame_message(subject, events, key, Stamp.now())
        if expected_last_seq is not None:
            out.headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_seq)
        return await self._publish_one(out, expected_last_seq)

    async def send_frame(self, subject: str, items: Sequence[EncodedEvent], *, key: str) -> PendingAppend:
        """Send a frame of already encoded events without waiting for its ack; await ``result()`` for it.

        A frame of ``COMPRESS_MIN_BYTES`` (``streams.outgoing``) or more goes deflated
        (``Hx-Encoding: deflate``); this log's readers inflate it before decoding.

        Messages from one client reach the server in order, but a message lost in a reconnect
        can be overtaken by later ones: to keep a subject's frames in order, await a frame's
        ``result()`` before sending the next frame of that subject.
        """
        if not items:
            raise ValueError("a frame needs at least one event")
        if (why := misplaced(subject, [t for t, _, _, _ in items])) is not None:
            raise LogError(why)
        out = encoded_frame_message(subject, items, key, Stamp.now())
        if len(out.body) > self.nc.max_payload:
            raise out.too_large(self.nc.max_payload)
        if not self.nc.is_connected:  # see _pipeline: publish_async would leak a pending slot
            return PendingAppend(self, out, None)
        try:
            fut = await self.js.publish_async(subject, out.body, headers=out.headers)
        except _RETRYABLE:
            return PendingAppend(self, out, None)
        return PendingAppend(self, out, fut)

    async def _publish_one(self, out: Outgoing, expected: int | None) -> Appended:
        last_error: BaseException | None = None
        for attempt in range(self.retries + 1):
            if self.gone is not None:
                raise self.gone
            if attempt:
                self.retried += 1
                await asyncio.sleep(self.retry_backoff * attempt)
            try:
                ack = await self.js.publish(out.subject, out.body, timeout=self.ack_timeout, headers=out.headers)
            except BadRequestError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE and expected is not None:
                    ours = await self._stored_after(out, expected)
                    if ours is not None:
                        return ours
                    raise ConcurrencyConflict(out.subject, expected) from exc
                raise out.rejected(exc) from exc
            except APIError as exc:
                raise out.rejected(exc) from exc
            except nats.errors.MaxPayloadError as exc:
                raise out.too_large(self.nc.max_payload) from exc
            except _RETRYABLE as exc:
                if (refused := self.refusals.get(out.subject)) is not None:
                    raise refused from None  # a timeout that is the server's refusal: sending again cannot help
                last_error = exc
                continue
            if self.heads is not None and out.subject.startswith(LEDGER_PREFIX) and not ack.duplicate:
                await self.heads.record([await self.js.stream_info(LEDGER.name)])
            return Appended(ack.seq, out.key, bool(ack.duplicate))
        raise AppendTimeout(f"append to {out.subject!r} (key {out.key}) not acknowledged after "
                            f"{self.retries + 1} tries: {type(last_error).__name__}")

    async def _stored_after(self, out: Outgoing, expected: int) -> Appended | None:
        """Our own message when a conditional append was refused because it is already stored, else None.

        The server checks the expected subject sequence before the message id, so a
        conditional append sent again after a lost ack is refused as if another writer had
        won. The message right after ``expected`` on the subject says who did: if it carries
        our message id, the append succeeded the first time.
        """
        stream = stream_of(out.subject)
        if stream is None:
            return None
        try:
            msg = await self.js.get_msg(stream, seq=expected + 1, subject=out.subject, next=True)
        except NotFoundError:
            return None
        if (msg.headers or {}).get(MSG_ID) != out.key:
            return None
        return Appended(int(msg.seq or 0), out.key, duplicate=True)

    async def append_batch(self, entries: Iterable[Entry], *, frame_size: int = 1) -> list[Appended]:
        """Append many events with pipelined acks, at most ``max_in_flight`` unacknowledged.

        With ``frame_size > 1`` consecutive events for the same subject are packed into
        frames of up to that many events. Returns one ``Appended`` per message, in order.
        Raises ``UnacknowledgedAppends`` (carrying the keys) if some never got an ack.
        """
        now = Stamp.now()
        entries = [e if (to := routed(e.subject, e.event)) == e.subject else Entry(to, e.event, e.key, e.stamp)
                   for e in entries]
        if frame_size <= 1:
            known = known_bytes()  # once per batch, not per event
            outgoing = [entry_message(e, now, known) for e in entries]
        else:
            outgoing = pack_frames(list(entries), frame_size, now)
        for out in outgoing:  # before sending anything (a failed publish_async would also leak a slot)
            if len(out.body) > self.nc.max_payload:
                raise out.too_large(self.nc.max_payload)
        results: list[Appended | None] = [None] * len(outgoing)
        pending = list(range(len(outgoing)))
        reason = ""
        for attempt in range(self.retries + 1):
            if self.gone is not None:
                raise self.gone
            if attempt:
                self.retried += len(pending)
                await asyncio.sleep(self.retry_backoff * attempt)
            pending, reason = await self._pipeline(outgoing, pending, results)
            if not pending:
                break
            refused = next((r for i in pending if (r := self.refusals.get(outgoing[i].subject)) is not None), None)
            if refused is not None:
                raise refused
        if pending:
            raise UnacknowledgedAppends([outgoing[i].key for i in pending], reason)
        if self.heads is not None and any(o.subject.startswith(LEDGER_PREFIX) for o in outgoing):
            await self.heads.record([await self.js.stream_info(LEDGER.name)])
        return [r for r in results if r is not None]

    async def _pipeline(self, outgoing: list[Outgoing], indexes: list[int],
                        results: list[Appended | None]) -> tuple[list[int], str]:
        """Send the given messages with a bounded window; return the ones not acked and why."""
        inflight: deque[tuple[int, asyncio.Future[PubAck], float]] = deque()
        failed: list[int] = []
        reason = ""

        async def settle(i: int, fut: asyncio.Future[PubAck], deadline: float) -> None:
            nonlocal reason
            try:
                results[i] = await _await_ack(outgoing[i], fut, deadline)
            except _RETRYABLE as exc:  # retried with the same id
                failed.append(i)
                reason = type(exc).__name__

        for i in indexes:
            if len(inflight) >= self.max_in_flight:
                await settle(*inflight.popleft())
            out = outgoing[i]
            if not self.nc.is_connected:
                # nats-py registers publish_async's ack future before sending; when the reconnect
                # buffer is full the send fails and that future holds one of the context's pending
                # slots forever (publish_async then blocks for good). Leave it to the next try.
                failed.append(i)
                reason = "not connected"
                continue
            try:
                fut = await self.js.publish_async(out.subject, out.body, headers=out.headers)
            except _RETRYABLE as exc:
                failed.append(i)
                reason = type(exc).__name__
                continue
            inflight.append((i, fut, time.monotonic() + self.ack_timeout))
        while inflight:
            await settle(*inflight.popleft())
        return sorted(failed), reason

    # --- reads (streams.reading) -----------------------------------------------------

    async def last_seq(self, stream: str = TRACE.name) -> int:
        """The sequence of the newest message in ``stream`` (0 when empty)."""
        return await reading.last_seq(self.js, stream)

    async def last_subject_seq(self, subject: str, stream: str = TRACE.name) -> int:
        """The sequence of the newest message on ``subject`` (0 when none), for conditional appends."""
        return await reading.last_subject_seq(self.js, subject, stream)

    async def _segments(self, stream: str, start: int, stop: int | None, subjects: Sequence[str],
                        types: Iterable[str], *, clamp: bool = True) -> tuple[int, list[tuple[int, int, list[str]]]]:
        """The stream's last sequence, and the ranges of a read with the server filters of each.

        On ``HX_TRACE`` an attempt's summary events are on channels (``streams.channels``): a read
        of only such types is narrowed from the stream's layout marker on, every other read gains
        the channels of the attempts it names.
        """
        info = await self.js.stream_info(stream)
        last = int(info.state.last_seq or 0)
        if stop is None:  # to the end now; a follower's last range at least reaches ``start`` (followed past it)
            stop = last if clamp else max(start, last)
        elif clamp:
            stop = min(stop, last)
        if stream != TRACE.name:
            return last, [(start, stop, list(subjects))]
        first = self._layouts.get(stream)
        if first is None:
            first = await channels_from(self.js, info)
            if first is not None:
                self._layouts[stream] = first  # a marker never moves while its stream exists
        return last, segments(start, stop, subjects, list(types), first)

    async def read(self, stream: str = TRACE.name, *, start: int = 1, stop: int | None = None,
                   subjects: Sequence[str] = (), types: Iterable[str] = (),
                   batch: int = 1000) -> AsyncGenerator[Record, None]:
        """Yield the records of ``stream`` from sequence ``start`` up to ``stop`` (default: the end now).

        ``subjects`` filter on the server; with ``types`` only events of those types are decoded and
        yielded, and a trace read of only summary and run- or round-level types is served from their
        own subjects, without the attempts' frames.
        """
        async for chunk in self.read_chunks(stream, start=start, stop=stop, subjects=subjects, types=types,
                                            batch=batch):
            for record in chunk:
                yield record

    async def read_chunks(self, stream: str = TRACE.name, *, start: int = 1, stop: int | None = None,
                          subjects: Sequence[str] = (), types: Iterable[str] = (),
                          batch: int = 1000) -> AsyncGenerator[list[Record], None]:
        """``read``, a list of records at a time (what one message held): for folds that loop tightly."""
        types = tuple(types)
        _, parts = await self._segments(stream, start, stop, subjects, types)
        for lo, hi, filters in parts:
            if lo > hi:
                continue
            if self.direct:
                chunk: list[Record] = []
                async for record in direct.read(self.nc, stream, lo, filters, types, stop=hi,
                                                timeout=self.ack_timeout, quarantine=self.quarantine):
                    chunk.append(record)
                    if len(chunk) >= batch:
                        yield chunk
                        chunk = []
                if chunk:
                    yield chunk
                continue
            async for chunk in reading.consume_chunks(self.js, stream, lo, filters, types, batch, stop=hi,
                                                      timeout=self.ack_timeout, quarantine=self.quarantine):
                yield chunk

    async def subscribe(self, stream: str = TRACE.name, *, start: int = 1, subjects: Sequence[str] = (),
                        types: Iterable[str] = (), batch: int = 1000,
                        until: asyncio.Event | None = None) -> AsyncGenerator[Record, None]:
        """Yield records from ``start`` on, then new ones as they arrive, until the caller stops or ``until`` is set.

        ``until`` is checked between fetches (at least once a second), so a follower can be
        stopped without cancelling a fetch in flight. A log that reads ``direct`` cannot follow.
        Filtered as ``read`` is: what lies before the layout marker is read first, in full.
        """
        if self.direct:
            raise LogError("the auditor's connection reads with direct gets and cannot follow a stream")
        types = tuple(types)
        _, parts = await self._segments(stream, start, None, subjects, types, clamp=False)
        *before, (lo, _, filters) = parts
        for b_lo, b_hi, b_filters in before:
            async for chunk in reading.consume_chunks(self.js, stream, b_lo, b_filters, types, batch, stop=b_hi,
                                                      timeout=self.ack_timeout, quarantine=self.quarantine):
                for record in chunk:
                    yield record
        async for record in reading.consume(self.js, stream, lo, filters, types, batch, stop=None,
                                            timeout=self.ack_timeout, quarantine=self.quarantine, until=until):
            yield record

    async def read_object(self, bucket: str, name: str) -> bytes | None:
        """The bytes of object ``name`` in object store ``bucket`` (None: absent), read with direct gets."""
        return await direct.read_object(self.nc, bucket, name, self.ack_timeout)


__all__ = ["MSG_ID", "Appended", "EncodedEvent", "EventLog", "PendingAppend"]
