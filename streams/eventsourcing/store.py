"""JetStream access for the ``eventsourcing`` recorders: atomic batches, direct reads, watches.

One ``JetStreamDatastore`` holds one NATS connection driven from one ``LoopThread``; the
recorders of a factory share it from any number of threads. Every call's NATS failure is
translated into an ``eventsourcing.persistence`` error (by ``streams.eventsourcing.replies``) before it
leaves the datastore.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
from eventsourcing.persistence import DataError, OperationalError, PersistenceError, ProgrammingError
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from streams.config import NatsSettings
from streams.eventsourcing.bridge import LoopClosedError, LoopThread
from streams.eventsourcing.layout import BATCH_COMMIT, BATCH_ID, BATCH_SEQUENCE, OutMsg, StoredMsg, StreamLayout
from streams.eventsourcing.replies import ERR_STREAM_NAME_IN_USE, direct_get_error, parse_ack, stored_msg, translate
from streams.redaction import mask_url

log = logging.getLogger(__name__)

T = TypeVar("T")

READ_BATCH = 1000  # messages per direct-get round trip
MAX_INFLIGHT_BATCHES = 32  # the server caps open atomic batches per stream (50 by default)
CONNECT_TIMEOUT = 2.0
GRACE = 1.0  # extra wait on the bridge beyond the NATS-level timeout of each call


class Stoppable(Protocol):
    """Something the datastore stops when it closes (subscriptions)."""

    def stop(self) -> None:
        """Stop it."""


@dataclass
class _Collector:
    """The replies to one direct-get batch request, gathered until end-of-batch."""

    done: asyncio.Future[None]
    msgs: list[StoredMsg] = field(default_factory=list)
    pending: int = 0


class Watch:
    """A headers-only ordered consumer that calls back once per newly stored message."""

    def __init__(self, datastore: JetStreamDatastore, sub: Any) -> None:
        self._datastore = datastore
        self._sub: Any = sub

    def close(self) -> None:
        """Delete the consumer (idempotent; quiet when the connection is already closed)."""
        sub, self._sub = self._sub, None
        if sub is not None and not self._datastore.closed:
            try:
                self._datastore.call(sub.unsubscribe(), "unsubscribe")
            except PersistenceError as e:
                log.debug("unsubscribe failed: %s", e)


async def _quiet_error_cb(e: Exception) -> None:
    """nats-py's default error callback logs full tracebacks for every failed reconnect."""
    log.debug("NATS connection error: %s", type(e).__name__)


class JetStreamDatastore:
    """One NATS connection on its own loop thread, shared by the recorders of a factory."""

    def __init__(self, url: str, settings: NatsSettings, client_name: str = "hx-eventsourcing") -> None:
        self.timeout = settings.ack_timeout
        self._loop = LoopThread(name=f"{client_name}-loop")
        self._ensured: set[str] = set()
        self._ensure_lock = threading.Lock()
        self._collectors: dict[str, _Collector] = {}
        self._stoppables: weakref.WeakSet[Stoppable] = weakref.WeakSet()
        self._close_lock = threading.Lock()
        self._closed = False
        self._inbox = ""
        try:
            self._nc: Client = self._loop.run(
                self._connect(url, settings, client_name), 2 * CONNECT_TIMEOUT + 5 * GRACE
            )
        except BaseException as e:
            self._loop.close()
            if isinstance(e, TimeoutError | nats.errors.Error | OSError):
                raise OperationalError(f"cannot connect to NATS at {mask_url(url)} ({type(e).__name__})") from e
            raise
        self._js = self._nc.jetstream(timeout=self.timeout)

    async def _connect(self, url: str, settings: NatsSettings, client_name: str) -> Client:
        # Fail fast when nothing answers at first (one retry), then reconnect for as long
        # as it takes: a restarted server must not break a long-lived application.
        nc = await nats.connect(
            url, name=client_name, connect_timeout=CONNECT_TIMEOUT, max_reconnect_attempts=1,
            reconnect_time_wait=0.1, error_cb=_quiet_error_cb, **settings.connect_options(),
        )
        nc.options["max_reconnect_attempts"] = -1
        nc.options["reconnect_time_wait"] = 2.0
        self._batch_slots = asyncio.Semaphore(MAX_INFLIGHT_BATCHES)
        self._inbox = nc.new_inbox()
        await nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
        return nc

    @property
    def closed(self) -> bool:
        """True once ``close`` has begun."""
        return self._closed

    def call(self, coro: Coroutine[Any, Any, T], what: str, timeout: float | None = None) -> T:
        """Run ``coro`` on the loop thread, translating failures; ``timeout=None`` waits for
        coroutines that bound each of their own steps."""
        wait = None if timeout is None else timeout + GRACE
        try:
            return self._loop.run(coro, wait)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt | SystemExit):
                raise
            raise translate(e, what, self.timeout if timeout is None else timeout) from e

    def track(self, stoppable: Stoppable) -> None:
        """Stop ``stoppable`` (a subscription) when the datastore closes."""
        self._stoppables.add(stoppable)

    def close(self) -> None:
        """Stop subscriptions, close the connection and the loop thread (idempotent)."""
        with self._close_lock:
            if self._closed:
                return
            for stoppable in list(self._stoppables):
                stoppable.stop()
            self._closed = True
        try:
            self._loop.run(self._nc.close(), self.timeout + GRACE)
        except (TimeoutError, LoopClosedError, RuntimeError, nats.errors.Error, OSError) as e:
            log.debug("closing the NATS connection failed: %s", type(e).__name__)
        self._loop.close()

    # -- streams ---------------------------------------------------------------------------

    def ensure_stream(self, layout: StreamLayout) -> None:
        """Create the layout's stream unless this datastore already did (idempotent)."""
        with self._ensure_lock:
            if layout.stream in self._ensured:
                return
            self.call(self._ensure(layout), f"create stream {layout.stream}", self.timeout)
            self._ensured.add(layout.stream)

    async def _ensure(self, layout: StreamLayout) -> None:
        config = layout.stream_config()
        if layout.managed:  # hx's topology made it: only check that it takes our subjects
            try:
                existing = (await self._js.stream_info(layout.stream)).config
            except nats.js.errors.NotFoundError:
                raise ProgrammingError(f"stream {layout.stream} does not exist: it is made when hx connects "
                                       "(streams.connection.connect applies the topology)") from None
            uncovered = [s for s in config.subjects or () if not covered(s, existing.subjects or ())]
            if uncovered or not existing.allow_atomic or not existing.allow_direct:
                raise ProgrammingError(f"stream {layout.stream} does not take {uncovered} or lacks atomic batches "
                                       "or direct gets")
            return
        try:
            await self._js.add_stream(config)
        except nats.js.errors.BadRequestError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
            # It exists with another configuration: fine if it has what we rely on.
            existing = (await self._js.stream_info(layout.stream)).config
            missing = set(config.subjects or ()) - set(existing.subjects or ())
            if missing or not existing.allow_atomic or not existing.allow_direct:
                raise ProgrammingError(
                    f"stream {layout.stream} exists without what the recorders need "
                    f"(subjects {sorted(missing)}, allow_atomic, allow_direct)"
                ) from e

    # -- writes ----------------------------------------------------------------------------

    def publish(self, msgs: Sequence[OutMsg], what: str) -> tuple[int, int]:
        """Store ``msgs`` all-or-nothing; return (last stream sequence, message count)."""
        return self.call(self._publish(msgs), what, self.timeout)

    async def _publish(self, msgs: Sequence[OutMsg]) -> tuple[int, int]:
        nc = self._nc
        if len(msgs) == 1:
            # A single message is atomic anyway; skip the batch headers.
            sends = [(msgs[0], msgs[0].headers)]
        else:
            batch_id = uuid.uuid4().hex
            sends = [
                (msg, {**msg.headers, BATCH_ID: batch_id, BATCH_SEQUENCE: str(index)})
                for index, msg in enumerate(msgs, 1)
            ]
            sends[-1][1][BATCH_COMMIT] = "1"
        # Check sizes before sending anything: the server drops a connection that sends
        # an oversized message, and a half-sent batch would linger until it times out.
        for msg, headers in sends:
            if len(msg.data) + _header_size(headers) > nc.max_payload:
                raise DataError(
                    f"a {len(msg.data)}-byte event exceeds the server's max_payload of {nc.max_payload} bytes"
                )
        *body, (final, final_headers) = sends
        async with self._batch_slots if body else contextlib.nullcontext():
            # Plain publish for 1..n-1 and one request for the commit: nats-py's
            # publish_async never resolves when the server rejects (nats.py issue 985).
            for msg, headers in body:
                await nc.publish(msg.subject, msg.data, headers=headers)
            reply = await nc.request(final.subject, final.data, timeout=self.timeout, headers=final_headers)
        return parse_ack(reply.data, len(msgs))

    # -- reads -----------------------------------------------------------------------------

    def last(self, stream: str, subject_filter: str, what: str) -> StoredMsg | None:
        """The last stored message matching ``subject_filter`` (wildcards allowed), if any."""
        return self.call(self._last(stream, subject_filter), what, self.timeout)

    async def _last(self, stream: str, subject_filter: str) -> StoredMsg | None:
        request = msgspec.json.encode({"last_by_subj": subject_filter})
        reply = await self._nc.request(f"$JS.API.DIRECT.GET.{stream}", request, timeout=self.timeout)
        headers = reply.headers or {}
        status = headers.get("Status")
        if status == "404":
            return None
        if status is not None:
            raise direct_get_error(status, headers)
        return stored_msg(reply)

    def read(
        self, stream: str, subject_filter: str, start: int, limit: int | None, stop: int | None,
        accept: Callable[[StoredMsg], bool] | None, what: str,
    ) -> list[StoredMsg]:
        """Messages matching ``subject_filter`` from sequence ``start`` (to ``stop``), in
        sequence order, at most ``limit`` of those ``accept`` keeps."""
        return self.call(self._read(stream, subject_filter, start, limit, stop, accept), what)

    async def _read(
        self, stream: str, subject_filter: str, start: int, limit: int | None, stop: int | None,
        accept: Callable[[StoredMsg], bool] | None,
    ) -> list[StoredMsg]:
        found: list[StoredMsg] = []
        seq = start
        while limit is None or len(found) < limit:
            want = READ_BATCH if limit is None or accept is not None else min(READ_BATCH, limit - len(found))
            if stop is not None:
                if seq > stop:
                    break
                want = min(want, stop - seq + 1)
            msgs, pending = await self._get_batch(stream, subject_filter, seq, want)
            for msg in msgs:
                if stop is not None and msg.seq > stop:
                    return found
                if accept is None or accept(msg):
                    found.append(msg)
                    if limit is not None and len(found) >= limit:
                        return found
            if not msgs or pending <= 0:
                break
            seq = msgs[-1].seq + 1
        return found

    async def _get_batch(self, stream: str, subject_filter: str, seq: int, batch: int) -> tuple[list[StoredMsg], int]:
        # Replies stream into one shared inbox subscription, keyed by a token per request.
        token = uuid.uuid4().hex
        collector = _Collector(asyncio.get_running_loop().create_future())
        self._collectors[token] = collector
        try:
            request = msgspec.json.encode({"seq": seq, "batch": batch, "next_by_subj": subject_filter})
            await self._nc.publish(f"$JS.API.DIRECT.GET.{stream}", request, reply=f"{self._inbox}.{token}")
            await asyncio.wait_for(collector.done, self.timeout)
        finally:
            self._collectors.pop(token, None)
        return collector.msgs, collector.pending

    async def _on_reply(self, msg: Msg) -> None:
        collector = self._collectors.get(msg.subject.rsplit(".", 1)[-1])
        if collector is None or collector.done.done():
            return  # a reply to a request that already timed out
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is None:
            collector.msgs.append(stored_msg(msg))
        elif status == "204":  # end of batch
            collector.pending = int(headers.get("Nats-Num-Pending", "0"))
            collector.done.set_result(None)
        elif status == "404":  # nothing (more) matches
            collector.done.set_result(None)
        else:
            collector.done.set_exception(direct_get_error(status, headers))

    # -- change notification ---------------------------------------------------------------

    def watch(self, stream: str, subject_filter: str, callback: Callable[[], None]) -> Watch:
        """Call ``callback`` (on the loop thread) after each new message matching the filter is stored."""

        async def on_msg(_: Msg) -> None:
            callback()

        async def subscribe() -> Any:
            # A JetStream consumer only delivers stored messages, unlike a core
            # subscription, which sees a publish before (or without) it being stored.
            return await self._js.subscribe(
                subject_filter, stream=stream, ordered_consumer=True, headers_only=True,
                deliver_policy=DeliverPolicy.NEW, cb=on_msg,
            )

        return Watch(self, self.call(subscribe(), f"watch {subject_filter}", self.timeout))


def covered(subject: str, filters: Sequence[str]) -> bool:
    """True when a stream listening on ``filters`` captures every subject ``subject`` matches."""
    want = subject.split(".")
    for f in filters:
        have = f.split(".")
        for i, token in enumerate(have):
            if token == ">":
                if i < len(want):
                    return True
                break
            if i >= len(want) or (token != "*" and token != want[i]) or (token == "*" and want[i] == ">"):
                break
        else:
            if len(have) == len(want):
                return True
    return False


def _header_size(headers: dict[str, str]) -> int:
    """Bytes the headers take on the wire ("NATS/1.0" line, "k: v" lines, blank line)."""
    return 12 + sum(len(key) + len(value.encode()) + 4 for key, value in headers.items())

