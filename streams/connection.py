"""Opening the log: join or start the embedded server (or use ``HX_NATS_URL``), connect, apply topology."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from streams.config import NatsSettings
from streams.errors import LogError
from streams.log import EventLog
from streams.server import EmbeddedServer
from streams.topology import apply_topology


@dataclass
class Connection:
    """An open connection to hx's NATS: client, JetStream context and the event log."""

    nc: NATS
    js: JetStreamContext
    log: EventLog
    url: str
    server: EmbeddedServer | None


def redact_url(url: str) -> str:
    """A NATS URL with any user:password part removed, safe for messages."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


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
        try:
            nc = await nats.connect(
                url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                allow_reconnect=True, **settings.connect_options(),
            )
        except (OSError, nats.errors.Error) as exc:
            raise LogError(f"cannot connect to NATS at {redact_url(url)}: {type(exc).__name__}: {exc}") from None
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
