"""``hx server``: run the embedded nats-server in the foreground."""

from __future__ import annotations

import signal
from types import FrameType

import click
import structlog

from hx.cli._app import App, pass_app
from schemas.errors import HxError
from streams.processes import free_port
from streams.redaction import mask_url
from streams.server import EmbeddedServer

log = structlog.get_logger("hx.cli")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@click.command("server")
@click.option("--port", type=click.IntRange(1, 65535), help="Client port  [default: a free one]")
@pass_app
def server(app: App, port: int | None) -> None:
    """Run the embedded nats-server in the foreground.

    Other hx commands on the same data directory join it; Ctrl-C stops it. It has two users:
    the writer in DATA_DIR/nats/credentials.json and the read-only auditor in
    DATA_DIR/nats/auditor.json (both readable by you only).
    """
    if app.settings.url is not None:
        raise HxError(f"hx server runs the embedded nats-server, but a NATS URL is configured "
                      f"({mask_url(app.settings.url)}); unset HX_NATS_URL / --nats-url to use it")
    embedded = EmbeddedServer(app.settings.data_dir)
    running = embedded.record()
    if running is not None and running.alive():
        raise HxError(f"a server already runs for {app.settings.data_dir} at {running.url} (pid {running.pid})")
    port = port or free_port()
    # SIGTERM takes the same path as Ctrl-C, so the child server is stopped and the record removed.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    log.info("nats-server running; hx commands on this data dir join it, Ctrl-C stops it",
             url=f"nats://127.0.0.1:{port}", data_dir=str(app.settings.data_dir),
             credentials=str(embedded.credentials_path), auditor=str(embedded.auditor_path))
    try:
        code = embedded.run_foreground(port)
    finally:
        signal.signal(signal.SIGTERM, previous)
    log.info("nats-server stopped", exit_code=code)
    if code != 0:
        raise HxError(f"nats-server exited with code {code}; see {embedded.root / 'nats-server.log'}")
