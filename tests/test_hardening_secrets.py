"""Secrets: a password in a model URL, or an API key, appears in no output hx writes (grepped for, everywhere)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_server import model_server

from schemas.envelope import HX_ENCODING, inflate
from schemas.lifecycle import RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.redaction import MASK, register, scrub, scrub_body
from streams.topology import trace_subject

PASSWORD = "S3cret-Passw0rd-in-the-url"
API_KEY = "sk-test-key-that-must-not-leak-0123"


async def every_stored_message(data_dir: Path) -> list[bytes]:
    """Headers and (inflated) bodies of every message of every stream on the data directory's server."""
    out: list[bytes] = []
    async with connect(NatsSettings(data_dir=data_dir), apply=False) as conn:
        for info in await conn.js.streams_info():
            name = info.config.name
            assert name is not None
            for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1):
                msg = await conn.js.get_msg(name, seq)
                headers = msg.headers or {}
                body = msg.data or b""
                if headers.get(HX_ENCODING):
                    body = inflate(headers[HX_ENCODING], body)
                out.append(repr(headers).encode() + body)
    return out


def grep_everything(tmp_path: Path, data_dir: Path, done: subprocess.CompletedProcess[str], *secrets: str) -> None:
    """No secret in stdout, stderr, any file under ``tmp_path`` (results, server log) or any stored message."""
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "store" not in p.parts}
    assert files, "nothing was written"
    messages = asyncio.run(every_stored_message(data_dir))
    assert len(messages) > 5
    for secret in secrets:
        assert secret not in done.stdout and secret not in done.stderr, secret
        for path, data in files.items():
            if path.name != "credentials.json" and path.name != "server.conf":  # the server's own, mode 0600
                assert secret.encode() not in data, (secret, path)
        leaking = [m[:200] for m in messages if secret.encode() in m]
        assert not leaking, (secret, leaking)


def run_hx(data_dir: Path, out: Path, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HX_DATA_DIR": str(data_dir), **(env or {})}
    full.pop("HX_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "hx", "run", "--tasks", "2", "--attempts", "1", "--max-steps", "4",
                           "--out", str(out), *args], env=full, capture_output=True, text=True, timeout=180,
                          check=False)


@pytest.mark.slow
def test_a_password_in_the_model_url_is_nowhere(tmp_path: Path) -> None:
    data_dir = tmp_path / "hx"
    with model_server("play") as server:
        done = run_hx(data_dir, tmp_path / "results" / "ok.json", "--model",
                      f"openai:m@http://hxuser:{PASSWORD}@{server.url}/v1", "--run-id", "with-password")
    assert done.returncode == 0, done.stderr
    assert server.authorizations and all(a.startswith("Basic ") for a in server.authorizations)  # it was used
    assert f"openai:m@http://{MASK}@{server.url}/v1" in done.stderr  # shown masked, where it is shown
    grep_everything(tmp_path, data_dir, done, PASSWORD)


@pytest.mark.slow
def test_credentials_echoed_by_a_failing_server_are_nowhere(tmp_path: Path) -> None:
    data_dir = tmp_path / "hx"
    with model_server("refuse") as server:
        done = run_hx(data_dir, tmp_path / "results" / "refused.json", "--model",
                      f"openai:m@http://hxuser:{PASSWORD}@{server.url}/v1", "--run-id", "echoed",
                      env={"HX_OPENAI_API_KEY": API_KEY})
    assert done.returncode == 1, done.stderr
    assert "invalid credentials" in done.stderr  # the server's words reach the user, its echo of the secret not
    grep_everything(tmp_path, data_dir, done, PASSWORD, API_KEY, f"hxuser:{PASSWORD}")


async def test_the_log_masks_a_registered_secret_in_any_event(nats_url: str) -> None:
    """The last line of defence: whatever event carries a secret, the stored body does not."""
    register("a-registered-secret-value")
    event = RunStarted(run_id="r", config={"note": "token a-registered-secret-value and http://u:pw@h/x"})
    async with connect(NatsSettings(url=nats_url)) as conn:
        ack = await conn.log.append(trace_subject("r"), event)
        msg = await conn.js.get_msg("HX_TRACE", ack.seq)
        [record] = [r async for r in conn.log.read()]
    assert msg.data is not None
    assert b"a-registered-secret-value" not in msg.data and b"u:pw" not in msg.data
    assert isinstance(record.event, RunStarted)
    assert record.event.config["note"] == f"token {MASK} and http://{MASK}@h/x"


def test_scrub_masks_url_credentials_of_any_length_and_leaves_the_rest() -> None:
    assert scrub("GET http://a:b@host/v1 ok") == f"GET http://{MASK}@host/v1 ok"
    assert scrub("nats://u:p@ss@h:4222") == f"nats://{MASK}@h:4222"
    assert scrub("openai:m@http://host/v1") == "openai:m@http://host/v1"  # no credentials: unchanged
    assert scrub("mail me@example.com") == "mail me@example.com"
    body = b"\x81\xa4note\xa3abc"
    assert scrub_body(body) is body  # nothing to mask: the very same bytes, no re-encoding
