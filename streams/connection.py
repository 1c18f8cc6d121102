"""Opening the log: join or start the embedded server (or use ``HX_NATS_URL``), connect, apply topology."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from streams.config import NatsSettings, redact_url
from streams.errors import LogError
from streams.log import EventLog
from streams.server import EmbeddedServer
from streams.topology import apply_topology

_log = structlog.get_logger("hx.streams")


@dataclass
class Connection:
    """An open connection to hx's NATS: client, JetStream context and the event log."""

    nc: NATS
    js: JetStreamContext
    log: EventLog
    url: str
    server: EmbeddedServer | None


@contextlib.asynccontextmanager
async def connect(settings: NatsSettings | None = None, *, apply: bool = True) -> AsyncIterator[Connection]:
    """Connect to hx's NATS (embedded unless ``HX_NATS_URL`` is set) and yield the connection."""
    settings = settings or NatsSettings.from_env()
    server: EmbeddedServer | None = None
    url = settings.url
    if url is None:
        server = EmbeddedServer(settings.data_dir)
        url = server.acquire()
    try:
        connected = False

        async def on_error(exc: Exception) -> None:
            # With unlimited reconnects nats-py retries a failed *first* connect forever (wrong URL,
            # server down, bad credentials): fail fast instead. Once connected, errors only log.
            if not connected:
                raise exc
            _log.warning("nats connection error", error=f"{type(exc).__name__}: {exc}")

        nc = NATS()
        try:
            await nc.connect(  # nats-py annotates reconnect_time_wait as int but sleeps on any number
                url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2,  # type: ignore[arg-type]
                allow_reconnect=True, error_cb=on_error, **settings.connect_options(),
            )
        except (OSError, nats.errors.Error) as exc:  # TimeoutError is an OSError
            with contextlib.suppress(Exception):
                await nc.close()
            raise LogError(f"cannot connect to NATS at {redact_url(url)}: {type(exc).__name__}: {exc}") from None
        connected = True
        try:
            js = nc.jetstream(publish_async_max_pending=4096)
            if apply:
                await apply_topology(js)
            yield Connection(nc, js, EventLog(nc, js, ack_timeout=settings.ack_timeout), url, server)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await nc.drain()
    finally:
        if server is not None:
            server.release()
