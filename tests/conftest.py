"""Shared fixtures: every test that needs NATS gets its own real nats-server."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from streams.server import NatsProcess


def pytest_configure(config: pytest.Config) -> None:
    """Give the suite Ctrl-C back when a shell started it in the background with SIGINT ignored."""
    # An ignored signal stays ignored across exec: every hx command a test starts would ignore the
    # SIGINT the test sends it (as a background job should), and the tests of Ctrl-C would fail or
    # pass only through their SIGTERM fallback. A handled signal is reset to its default by exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsProcess]:
    """A fresh nats-server with JetStream on a free loopback port (starts in ~10 ms)."""
    proc = NatsProcess(tmp_path / "nats" / "store")
    proc.start(detach=False)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def nats_url(nats_server: NatsProcess) -> str:
    """The URL of the test's own nats-server."""
    return nats_server.url


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[tuple[NATS, JetStreamContext]]:
    """A plain nats-py client on the test's server (no hx in between) and its JetStream context."""
    nc = await nats.connect(nats_url)
    try:
        yield nc, nc.jetstream()
    finally:
        await nc.close()


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a nats-server (another hx process, or whatever a stale pid now names)."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """Undo any logging configuration a test (say, a CLI run) made, so tests do not leak into each other."""
    yield
    structlog.reset_defaults()
