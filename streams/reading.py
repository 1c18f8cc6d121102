"""Reading a stream: its records in order through an ephemeral pull consumer, what cannot be read quarantined.

``EventLog.read`` and ``EventLog.subscribe`` are the entry points; they hand these functions
the log's JetStream context, ack timeout and ``Quarantine`` on every call. A read creates its
own consumer (no acks, in memory, filtered by subject on the server, starting at the wanted
sequence) and deletes it when done, so readers never share or leave state on the server.

A message that cannot be decoded (a foreign publisher, a corrupt or unknown body, an unknown
encoding) never crashes a reader: it is skipped and kept in the quarantine with the reason.
On ``HX_TRACE`` so is a message whose subject is no trace address, and an event whose body
disagrees with its subject (``streams.addressing``): folds key by one or the other, so such
an event would be counted under the wrong task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from schemas.envelope import Record, decode_message
from schemas.errors import DecodeError
from streams.addressing import mismatch, subject_problem
from streams.channels import attempt_subject
from streams.quarantine import Quarantine, Quarantined
from streams.topology import TRACE

FETCH_BYTES = 8 * 1024 * 1024
"""About how many bytes one read fetch asks for (its message count is sized from the bytes seen so far)."""
FIRST_FETCH = 32
"""Messages in a read's first fetch, before any size is known (at most 32 MiB at the 1 MiB payload limit)."""


async def last_seq(js: JetStreamContext, stream: str) -> int:
    """The sequence of the newest message in ``stream`` (0 when empty)."""
    info = await js.stream_info(stream)
    return int(info.state.last_seq)


async def last_subject_seq(js: JetStreamContext, subject: str, stream: str) -> int:
    """The sequence of the newest message on ``subject`` (0 when none)."""
    try:
        msg = await js.get_last_msg(stream, subject)
    except NotFoundError:
        return 0
    return int(msg.seq or 0)


async def consume(js: JetStreamContext, stream: str, start: int, subjects: Sequence[str], types: Iterable[str],
                  batch: int, *, stop: int | None, timeout: float, quarantine: Quarantine,
                  until: asyncio.Event | None = None) -> AsyncIterator[Record]:
    """Yield the records of ``stream`` from ``start``: up to ``stop``, or with no ``stop`` on as they arrive.

    With ``stop`` a fetch waits ``timeout`` seconds; without, one second, so that ``until`` is
    checked between fetches at least once a second. ``subjects`` filter on the server,
    ``types`` here (events of other types are not decoded); ``batch`` caps the messages of one fetch.
    """
    async for chunk in consume_chunks(js, stream, start, subjects, types, batch, stop=stop, timeout=timeout,
                                      quarantine=quarantine, until=until):
        for record in chunk:
            yield record


async def consume_chunks(js: JetStreamContext, stream: str, start: int, subjects: Sequence[str],
                         types: Iterable[str], batch: int, *, stop: int | None, timeout: float,
                         quarantine: Quarantine, until: asyncio.Event | None = None) -> AsyncIterator[list[Record]]:
    """``consume``, one list of records per message (a fold loops over a frame's list, not one generator step per
    event)."""
    wanted = frozenset(types)
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start),
        ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True, num_replicas=1,
        max_waiting=1,
    )
    if len(subjects) > 1:
        config.filter_subjects = list(subjects)
    sub = await js.pull_subscribe(subjects[0] if len(subjects) == 1 else "", stream=stream, config=config)
    consumer: str | None = None
    try:
        info = await sub.consumer_info()
        consumer = info.name
        if stop is not None and info.num_pending == 0:
            return
        # A fetch asks for a number of messages, not bytes: a thousand 500 KiB frames would
        # overrun the server's per-client outbound limit (64 MiB), which then drops the
        # connection as a slow consumer. Start small and size each fetch by the bytes seen.
        size = min(batch, FIRST_FETCH)
        while until is None or not until.is_set():
            try:
                msgs = await sub.fetch(size, timeout=1.0 if stop is None else timeout)
            except TimeoutError:  # nats-py raises its own subclass or asyncio's
                if stop is None or ((await sub.consumer_info()).num_pending or 0) > 0:
                    continue  # a slow server is not the end of the range
                return  # nothing more matches the filter before ``stop``
            if msgs:
                mean = sum(len(m.data) for m in msgs) // len(msgs) + 1
                size = max(1, min(batch, FETCH_BYTES // mean))
            for msg in msgs:
                meta = msg.metadata
                seq = meta.sequence.stream
                if stop is not None and seq > stop:
                    return
                # One message's records at a time: a fetch of 8 MiB of deflated frames holds ~100k events,
                # and decoding them all at once held them all (and made every garbage collection scan them).
                records = decode(stream, msg.subject, seq, msg.headers, msg.data, quarantine, wanted)
                if records:
                    yield records
                if stop is not None and (seq >= stop or meta.num_pending == 0):
                    return
    finally:
        try:
            await sub.unsubscribe()
            if consumer is not None:
                await js.delete_consumer(stream, consumer)
        except nats.errors.Error:  # the ephemeral consumer times out on its own anyway
            pass


def decode(stream: str, subject: str, seq: int, headers: dict[str, str] | None, body: bytes,
           quarantine: Quarantine, types: frozenset[str] = frozenset()) -> list[Record]:
    """The records of one message; one that cannot be read, or an event off its subject, goes to ``quarantine``.

    With ``types``, only events of those types: the bodies of the others are not decoded.
    """
    if stream == TRACE.name and (problem := subject_problem(subject)) is not None:
        quarantine.add(Quarantined(stream, subject, seq, problem, (headers or {}).get("Hx-Type"), len(body)))
        return []
    on_channel = subject.count(".") == 6  # an attempt's channel: only its own type belongs there
    try:
        # A record's subject is its attempt's, whichever of the attempt's subjects held it (streams.channels).
        records = decode_message(attempt_subject(subject) if on_channel else subject, seq, headers, body, types)
    except DecodeError as exc:
        quarantine.add(Quarantined(stream, subject, seq, exc.reason, (headers or {}).get("Hx-Type"), len(body)))
        return []
    if stream != TRACE.name:
        return records
    kept = records
    for record in records:
        if (on_channel or type(record.event).LEVEL) and (problem := mismatch(subject, record.event)) is not None:
            quarantine.add(Quarantined(stream, subject, seq, problem, record.type, len(body), record.index))
            kept = [r for r in kept if r is not record]
    return kept

