"""Opening the log: join or start the embedded server (or use ``HX_NATS_URL``), connect, check and apply topology.

When the embedded server dies under a connection, waiting for a reconnect is pointless:
the connection is closed at once, every append fails with one ``ServerGone`` error, and
the task that opened the connection is cancelled so the command ends within moments with
that error, instead of retrying against a dead port until some timeout. An external
server may come back, so there the client reconnects as before (logging the outage once).

A connection is the writer's (every hx command) or, with ``auditor=True``, the read-only
auditor's (``hx audit``, ``hx ledger``): it neither applies the topology nor records stream
heads, it only checks them, and its log reads with direct gets (``streams.direct``). A
request the server refused for want of permission surfaces as one ``PermissionDenied``
naming it (``streams.permissions``), not as nats-py's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from streams.config import NatsSettings
from streams.errors import AppendTimeout, LogError, ServerGone, UnacknowledgedAppends
from streams.integrity import Heads, local_heads
from streams.log import EventLog
from streams.permissions import Refusals
from streams.redaction import mask_url, register_url
from streams.server import EmbeddedServer
from streams.topology import SPECS, apply_topology, check_topology, stream_infos

_log = structlog.get_logger("hx.streams")


@dataclass
class Connection:
    """An open connection to hx's NATS: client, JetStream context and the event log."""

    nc: NATS
    js: JetStreamContext
    log: EventLog
    url: str
    server: EmbeddedServer | None
    heads: Heads | None = field(default=None, repr=False)
    auditor: bool = False
    """True for the read-only auditor's connection."""


class _Watch:
    """Tells a lost connection to a dead embedded server from a passing outage, and ends the session on the first."""

    def __init__(self, server: EmbeddedServer | None, owner: asyncio.Task[object] | None,
                 refusals: Refusals) -> None:
        self.server = server
        self.owner = owner
        self.refusals = refusals
        self.connected = False
        self.gone: ServerGone | None = None
        self.log: EventLog | None = None
        self.nc: NATS | None = None
        self.closing: asyncio.Task[None] | None = None
        """Closing the connection to the dead server: ``connect`` awaits it before it returns."""
        self._warned = False

    async def on_error(self, exc: Exception) -> None:
        # With unlimited reconnects nats-py retries a failed *first* connect forever (wrong URL,
        # server down, bad credentials): fail fast instead. Once connected, one warning per outage.
        if not self.connected:
            raise exc
        if self.refusals.add(str(exc)):  # not a connection error: the request that caused it fails on it
            _log.debug("nats refused a request", error=str(exc))
            return
        if self.server is not None and not self.server.serving():
            return  # the embedded server died: on_disconnected reports it, once
        if not self._warned and self.gone is None:
            self._warned = True
            _log.warning("nats connection error; reconnecting", error=f"{type(exc).__name__}: {exc}")

    async def on_reconnected(self) -> None:
        if self._warned:
            _log.info("nats connection restored")
        self._warned = False

    async def on_disconnected(self) -> None:
        if self.server is None or self.gone is not None or not self.connected or self.server.serving():
            return
        self.gone = ServerGone(f"the embedded nats-server for {self.server.root.parent} exited; see "
                               f"{self.server.root / 'nats-server.log'}")
        if self.log is not None:
            self.log.gone = self.gone
        if self.nc is not None:  # stop reconnecting to a dead port; the task is kept (a bare one may be collected)
            self.closing = asyncio.get_running_loop().create_task(close_lost(self.nc))
        if self.owner is not None and not self.owner.done():
            self.owner.cancel()


_TIMEOUTS = (TimeoutError, AppendTimeout, UnacknowledgedAppends)
"""How nats-py lets a refused request fail: a timeout (nats-py's own errors subclass TimeoutError)."""


@contextlib.asynccontextmanager
async def connect(settings: NatsSettings | None = None, *, apply: bool | None = None,
                  auditor: bool = False) -> AsyncIterator[Connection]:
    """Connect to hx's NATS (embedded unless ``HX_NATS_URL`` is set) and yield the connection.

    With ``apply`` (the default for the writer) the topology is checked and applied
    (``apply_topology``) and the stream heads are recorded again when the connection closes.
    With ``auditor`` the connection is the read-only auditor's: the topology and heads are
    only checked (``check_topology``), never written.
    """
    if apply is None:
        apply = not auditor
    if apply and auditor:
        raise ValueError("an auditor connection cannot apply the topology: it may not write")
    settings = settings or NatsSettings.from_env()
    server: EmbeddedServer | None = None
    url = settings.url
    if url is None:
        server = EmbeddedServer(settings.data_dir)
        url = server.acquire(auditor=auditor)
        user: str | None = urlsplit(url).username
    else:
        register_url(url)
        if auditor and settings.has_auditor:
            url = _without_userinfo(url)  # the URL's credentials are the writer's
        user = (settings.auditor_user if auditor and settings.has_auditor else settings.user) or urlsplit(url).username
    refusals = Refusals(unquote(user) if user else None)
    watch = _Watch(server, asyncio.current_task(), refusals)
    try:
        nc = NATS()
        watch.nc = nc
        try:
            await nc.connect(  # nats-py annotates reconnect_time_wait as int but sleeps on any number
                url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2,  # type: ignore[arg-type]
                allow_reconnect=True, error_cb=watch.on_error, disconnected_cb=watch.on_disconnected,
                reconnected_cb=watch.on_reconnected, **settings.connect_options(auditor=auditor),
            )
        except (OSError, nats.errors.Error) as exc:  # TimeoutError is an OSError
            with contextlib.suppress(Exception):
                await nc.close()
            raise LogError(f"cannot connect to NATS at {mask_url(url)}: {type(exc).__name__}: {exc}") from None
        watch.connected = True
        try:
            # Every JetStream request waits as long as an append's ack: one knob (HX_ACK_TIMEOUT)
            # for a loaded machine, not nats-py's fixed 5 s on the requests that are not retried.
            js = nc.jetstream(timeout=settings.ack_timeout, publish_async_max_pending=4096)
            heads = Heads(js, local_heads(settings)) if apply else None
            log = EventLog(nc, js, ack_timeout=settings.ack_timeout, heads=heads, refusals=refusals)
            log.direct = auditor  # it may create no consumer (streams.direct)
            watch.log = log
            try:
                if heads is not None:
                    await apply_topology(js, heads)
                elif auditor:
                    await check_topology(js, Heads(js, local_heads(settings), read_only=True))
                yield Connection(nc, js, log, url, server, heads, auditor)
            except asyncio.CancelledError:
                if watch.gone is not None:
                    _uncancel()
                    raise watch.gone from None
                raise
            except _TIMEOUTS:
                if (refused := refusals.first()) is not None:
                    raise refused from None
                raise
            if heads is not None and watch.gone is None:
                await heads.record(i for i in (await stream_infos(js, SPECS)).values() if i is not None)
        finally:
            if watch.closing is None:
                with contextlib.suppress(nats.errors.Error):
                    await nc.drain()
            if watch.closing is not None:  # the server died (perhaps while draining): its close, to the end
                await watch.closing
        if watch.gone is not None:
            raise watch.gone
    finally:
        if server is not None:
            server.release()


async def close_lost(nc: NATS) -> None:
    """Close a connection whose server is gone, raising nothing: what it buffered meanwhile is lost anyway.

    nats-py 2.16's ``close`` flushes the data buffered while it was reconnecting to the lost
    socket and raises ``ConnectionResetError`` there, skipping the rest of its cleanup: in a
    task nobody awaits, that was a "Task exception was never retrieved" traceback on stderr
    now and then (tests/test_hardening_processes.py). The pending data is dropped first, so
    the close runs to its end.
    """
    # nats-py's private buffer: the one way to keep its close from writing to a lost socket (2.16).
    nc._pending = []
    nc._pending_data_size = 0
    with contextlib.suppress(OSError, nats.errors.Error):
        await nc.close()


def _without_userinfo(url: str) -> str:
    """``url`` without ``user:password@``."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else url.rsplit("@", 1)[-1]


def _uncancel() -> None:
    """Undo the cancellation ``_Watch`` requested: the task goes on to raise ``ServerGone`` instead."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
