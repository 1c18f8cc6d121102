"""Reading without a consumer: batched direct gets, for the read-only auditor.

A user allowed to create consumers can create a *push* consumer whose deliver subject is
another stream's subject: the server then copies, say, every trace message into the ledger
(nats-server 2.15.1 does it once the consumer sees interest, at the latest after a restart),
and the ledger refuses deletes. No subject permission can tell a push consumer from a pull
one, so the auditor may create none, and reads with batched direct gets instead
(``$JS.API.DIRECT.GET.<stream>`` with ``batch``, nats-server 2.11 and later; every hx stream
and bucket allows direct gets): the server answers a batch with the messages, then a
``204 EOB`` status carrying how many match after them.

``read`` yields the same records as ``streams.reading.consume`` does for a bounded read
(undecodable messages go to the quarantine); ``read_object`` reads one object of an object
store from its metadata and chunk messages (both roles use it).
"""

from __future__ import annotations

import base64
import heapq
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from schemas.envelope import Record
from streams.errors import LogError
from streams.quarantine import Quarantine
from streams.reading import FETCH_BYTES, decode

BATCH = 1000
"""Messages asked for per direct get (the server also stops a batch at ``FETCH_BYTES``)."""


async def _messages(nc: NATS, stream: str, start: int, subject: str | None, stop: int,
                    timeout: float) -> AsyncIterator[Msg]:
    """The messages of ``stream`` from sequence ``start`` to ``stop`` (only ``subject``'s when given), in order."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        seq = max(1, start)
        while seq <= stop:
            request: dict[str, Any] = {"seq": seq, "batch": BATCH, "max_bytes": FETCH_BYTES}
            if subject:
                request["next_by_subj"] = subject
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox)
            while True:
                msg = await sub.next_msg(timeout=timeout)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status is None:
                    found = int(headers["Nats-Sequence"])
                    if found > stop:
                        return
                    seq = found + 1
                    yield msg
                elif status == "404":  # nothing (more) matches
                    return
                elif status == "503":
                    raise LogError(f"stream {stream} does not answer direct gets (no such stream, or allow_direct "
                                   "is off), and a read without a consumer needs them")
                elif status == "204":  # the end of this batch
                    if int(headers.get("Nats-Num-Pending", "0")) == 0:
                        return
                    break
                else:
                    raise LogError(f"direct get from stream {stream} refused: {status} "
                                   f"{headers.get('Description', '')}".rstrip())
    finally:
        await sub.unsubscribe()


async def _records(nc: NATS, stream: str, start: int, subject: str | None, stop: int, timeout: float,
                   quarantine: Quarantine, wanted: frozenset[str]) -> AsyncIterator[Record]:
    async for msg in _messages(nc, stream, start, subject, stop, timeout):
        headers = msg.headers or {}
        for record in decode(stream, headers["Nats-Subject"], int(headers["Nats-Sequence"]), headers, msg.data,
                             quarantine, wanted):
            yield record


async def read(nc: NATS, stream: str, start: int, subjects: Sequence[str], types: Iterable[str], *, stop: int,
               timeout: float, quarantine: Quarantine) -> AsyncIterator[Record]:
    """The records of ``stream`` from ``start`` to ``stop`` on any of ``subjects`` (all: none given), in order."""
    wanted = frozenset(types)
    filters: Sequence[str | None] = subjects or [None]
    sources = [_records(nc, stream, start, s, stop, timeout, quarantine, wanted) for s in filters]
    heap: list[tuple[int, int, int, Record]] = []
    for i, source in enumerate(sources):
        first = await anext(source, None)
        if first is not None:
            heapq.heappush(heap, (first.seq, first.index, i, first))
    last: tuple[int, int] | None = None
    while heap:  # several filters: their messages merged in stream order, each once
        seq, index, i, record = heapq.heappop(heap)
        if (seq, index) != last:
            yield record
        last = (seq, index)
        following = await anext(sources[i], None)
        if following is not None:
            heapq.heappush(heap, (following.seq, following.index, i, following))


async def read_object(nc: NATS, bucket: str, name: str, timeout: float) -> bytes | None:
    """The bytes of object ``name`` in object store ``bucket``: None when absent or deleted (callers check digests)."""
    stream = f"OBJ_{bucket}"
    meta = f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
    try:
        reply = await nc.request(f"$JS.API.DIRECT.GET.{stream}", json.dumps({"last_by_subj": meta}).encode(),
                                 timeout=timeout)
    except nats.errors.NoRespondersError:  # no such object store
        return None
    if (reply.headers or {}).get("Status") == "404":
        return None
    info = json.loads(reply.data)
    if info.get("deleted"):
        return None
    chunks = f"$O.{bucket}.C.{info['nuid']}"
    return b"".join([m.data async for m in _messages(nc, stream, 1, chunks, 1 << 62, timeout)])
