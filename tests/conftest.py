"""Shared fixtures: every test that needs NATS gets its own real nats-server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from streams.server import NatsProcess


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


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """Undo any logging configuration a test (say, a CLI run) made, so tests do not leak into each other."""
    yield
    structlog.reset_defaults()
