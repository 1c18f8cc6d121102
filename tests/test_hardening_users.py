"""NATS's own authorization: the writer cannot remove ledger or trace messages, the auditor reads and writes nothing.

Every test runs the embedded server of a tmp data directory (no ``HX_NATS_URL``), with the
users and permissions hx gives it, except the one that starts the external-server example
of docs/streams.md as written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import toyworld  # noqa: F401 - registers the toyworld benchmark the run evolves on
from hx_cli import error_line, hx, ok
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.lifecycle import RunStarted
from streams import direct
from streams.config import NatsSettings
from streams.connection import connect
from streams.errors import PermissionDenied, TopologyMissing
from streams.integrity import HEADS_BUCKET
from streams.permissions import AUDITOR_PUBLISH, AUDITOR_USER, WRITER_DENIED, WRITER_USER
from streams.processes import process_start
from streams.server import EmbeddedServer, NatsProcess
from streams.topology import BLOB_STORE, LEDGER, TRACE, trace_subject

DOCS = Path(__file__).resolve().parents[1] / "docs" / "streams.md"
REFUSED_WAIT = 1.0
"""How long a raw client waits for the answer to a request the server refuses (it never answers)."""


class Client:
    """A raw nats-py client of one user that keeps what the server refused (nats-py shows it only to ``error_cb``)."""

    def __init__(self) -> None:
        self.nc = NATS()
        self.refused: list[str] = []

    async def error(self, exc: Exception) -> None:
        self.refused.append(str(exc))

    @property
    def js(self) -> JetStreamContext:
        return self.nc.jetstream(timeout=REFUSED_WAIT)

    async def refuses(self, request: Awaitable[Any], subject: str) -> None:
        """``request`` times out and the server reported a permission violation for ``subject`` (or below it)."""
        with pytest.raises(nats.errors.TimeoutError):
            await request
        await self.nc.flush()  # the server's -ERR came before its PONG: error_cb has run
        assert f'permissions violation for publish to "{subject.lower()}' in " ".join(self.refused), self.refused


@asynccontextmanager
async def as_user(data_dir: Path, *, auditor: bool) -> AsyncIterator[Client]:
    """A raw client of the data dir's embedded server, as its writer or its auditor."""
    server = EmbeddedServer(data_dir)
    url = server.acquire(auditor=auditor)
    client = Client()
    try:
        await client.nc.connect(url, error_cb=client.error, allow_reconnect=False)
        try:
            yield client
        finally:
            await client.nc.close()
    finally:
        server.release()


async def some_history(data_dir: Path, ledger: int = 3) -> None:
    """Ledger and trace events and a blob, appended through hx (the writer)."""
    async with connect(NatsSettings(data_dir=data_dir)) as conn:
        for i in range(ledger):
            await conn.log.append(f"hx.ledger.test.{i}", RunStarted(run_id=f"edit-{i}"))
        await conn.log.append(trace_subject("r"), RunStarted(run_id="r"))
        await (await conn.js.object_store(BLOB_STORE)).put("blob", b"x" * 300_000)


async def counts(data_dir: Path) -> tuple[int, int]:
    """(ledger, trace) messages, read by the auditor."""
    async with connect(NatsSettings(data_dir=data_dir), auditor=True) as conn:
        return (int((await conn.js.stream_info(LEDGER.name)).state.messages),
                int((await conn.js.stream_info(TRACE.name)).state.messages))


# --- the writer ---------------------------------------------------------------------------

async def test_the_writer_cannot_delete_purge_update_or_edit_the_ledger_or_the_trace(tmp_path: Path) -> None:
    await some_history(tmp_path)
    async with as_user(tmp_path, auditor=False) as writer:
        js = writer.js
        for stream in (LEDGER.name, TRACE.name):
            config = (await js.stream_info(stream)).config
            await writer.refuses(js.delete_stream(stream), f"$JS.API.STREAM.DELETE.{stream}")
            await writer.refuses(js.purge_stream(stream), f"$JS.API.STREAM.PURGE.{stream}")
            await writer.refuses(js.delete_msg(stream, 1), f"$JS.API.STREAM.MSG.DELETE.{stream}")
            # a limit would evict events; turning deny_delete/deny_purge off the server refuses anyway
            await writer.refuses(js.update_stream(dataclasses.replace(config, max_msgs=1)),
                                 f"$JS.API.STREAM.UPDATE.{stream}")
        await writer.js.publish("hx.ledger.test.more", b"the writer still appends")
    assert await counts(tmp_path) == (4, 1)


async def test_hx_names_a_refused_request_instead_of_a_timeout(tmp_path: Path) -> None:
    await some_history(tmp_path, ledger=1)
    settings = NatsSettings(data_dir=tmp_path, ack_timeout=1.0)
    with pytest.raises(PermissionDenied, match=r"NATS refused user 'hx' to publish to "
                                               r'"\$js\.api\.stream\.delete\.hx_ledger" \(a permissions violation'):
        async with connect(settings) as conn:
            await conn.js.delete_stream(LEDGER.name)
    assert await counts(tmp_path) == (1, 1)  # nothing was removed


async def test_hx_applies_its_topology_to_an_existing_ledger_without_updating_it(tmp_path: Path) -> None:
    await some_history(tmp_path)
    async with connect(NatsSettings(data_dir=tmp_path)) as conn:  # the streams exist: checked, never updated
        await conn.log.append("hx.ledger.test.again", RunStarted(run_id="again"))
        assert conn.log.refusals.first() is None
    assert await counts(tmp_path) == (4, 1)


# --- the auditor ----------------------------------------------------------------------------

async def test_the_auditor_reads_every_stream_and_can_publish_to_none(tmp_path: Path) -> None:
    await some_history(tmp_path)
    async with as_user(tmp_path, auditor=True) as auditor:
        js = auditor.js
        assert (await js.stream_info(LEDGER.name)).state.messages == 3
        assert (await js.get_msg(LEDGER.name, 1)).data
        assert (await js.get_msg(LEDGER.name, 1, direct=True)).data
        assert (await (await js.key_value(HEADS_BUCKET)).get(LEDGER.name)).value
        assert await direct.read_object(auditor.nc, BLOB_STORE, "blob", 5.0) == b"x" * 300_000
        for subject in ("hx.ledger.forged", trace_subject("r", 0, "t", 0), f"$KV.{HEADS_BUCKET}.{LEDGER.name}"):
            await auditor.refuses(js.publish(subject, b"forged"), subject)
        await auditor.refuses(js.delete_stream(LEDGER.name), f"$JS.API.STREAM.DELETE.{LEDGER.name}")
        # no consumer at all: a push consumer could deliver the trace into a ledger subject
        await auditor.refuses(js.add_consumer(TRACE.name, ConsumerConfig(
            deliver_subject="hx.ledger.delivered", deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)),
            f"$JS.API.CONSUMER.CREATE.{TRACE.name}")
        await auditor.refuses(js.pull_subscribe("", stream=LEDGER.name), f"$JS.API.CONSUMER.CREATE.{LEDGER.name}")
    async with connect(NatsSettings(data_dir=tmp_path), auditor=True) as conn:  # hx reads with direct gets
        ledger = [r.event async for r in conn.log.read(LEDGER.name, subjects=["hx.ledger.test.2", "hx.ledger.test.0"])]
        assert ledger == [RunStarted(run_id="edit-0"), RunStarted(run_id="edit-2")]
        assert [r.event async for r in conn.log.read(TRACE.name)] == [RunStarted(run_id="r")]
        assert await conn.log.read_object(BLOB_STORE, "missing") is None
    assert await counts(tmp_path) == (3, 1)


async def test_hx_as_the_auditor_writes_nothing_and_names_a_refused_append(tmp_path: Path) -> None:
    with pytest.raises(TopologyMissing, match="streams HX_TRACE, HX_LEDGER, HX_LEARN do not exist"):
        async with connect(NatsSettings(data_dir=tmp_path), auditor=True):
            pass  # a fresh data dir: the auditor may not create the streams
    assert not (tmp_path / "heads.json").exists()
    with pytest.raises(ValueError, match="cannot apply"):
        async with connect(NatsSettings(data_dir=tmp_path), auditor=True, apply=True):
            pass
    await some_history(tmp_path)
    heads = (tmp_path / "heads.json").stat().st_mtime_ns
    settings = NatsSettings(data_dir=tmp_path, ack_timeout=1.0)
    refusal = re.escape('NATS refused user \'auditor\' to publish to "hx.ledger.forged"')
    with pytest.raises(PermissionDenied, match=refusal):
        async with connect(settings, auditor=True) as conn:
            assert conn.auditor and conn.heads is None
            await conn.log.append("hx.ledger.forged", RunStarted(run_id="forged"))
    assert conn.log.retried == 0  # refused once, not sent again
    async with connect(settings, auditor=True) as conn:
        events = [r.event async for r in conn.log.read(LEDGER.name)]
        assert events[0] == RunStarted(run_id="edit-0")
    assert (tmp_path / "heads.json").stat().st_mtime_ns == heads  # no head recorded by the auditor
    assert await counts(tmp_path) == (3, 1)


def test_audit_verify_and_ledger_run_as_the_auditor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    mask = os.umask(0o002)  # a umask that makes group-writable directories: hx's data dir is still its own
    try:
        ok(hx("--data-dir", str(data), "evolve", "--bench", "toyworld:rooms", "--tasks", "4", "--heldout-tasks",
              "2", "--rounds", "1", "--max-steps", "20", "--seed", "3", "--run-id", "audited"))
    finally:
        os.umask(mask)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for name in ("credentials.json", "auditor.json", "server.conf"):
        assert stat.S_IMODE((data / "nats" / name).stat().st_mode) == 0o600, name

    def no_writer(self: EmbeddedServer) -> tuple[str, str]:
        raise AssertionError("connected as the writer")
    monkeypatch.setattr(EmbeddedServer, "credentials", no_writer)  # a tripwire: only the auditor may be used
    verified = ok(hx("--data-dir", str(data), "audit", "verify", "audited"))
    assert verified.stdout.startswith("verified: ")
    listed = ok(hx("--data-dir", str(data), "ledger", "audited", "--json"))
    assert listed.stdout.count("\n") >= 3
    refused = hx("--data-dir", str(data), "log", "dump")  # any other command is the writer's
    assert "connected as the writer" in repr(refused.exception)


# --- a server or data dir of an older hx -----------------------------------------------------

def old_single_user_server(data_dir: Path, **record: Any) -> NatsProcess:
    """A nats-server started as the previous hx did: one user, no auditor, a record without a config digest."""
    root = data_dir / "nats"
    root.mkdir(parents=True, mode=0o700)
    creds = {"user": "hx", "password": "old-single-user-password"}
    (root / "credentials.json").write_text(json.dumps(creds))
    (root / "server.conf").write_text(f'authorization {{\n  user: "hx"\n  password: "{creds["password"]}"\n}}\n')
    for name in ("credentials.json", "server.conf"):
        os.chmod(root / name, 0o600)
    proc = NatsProcess(root / "store", config=root / "server.conf")
    proc.start(detach=True)
    rec = {"pid": proc.pid, "host": proc.host, "port": proc.port, "foreground": False,
           "started": process_start(proc.pid), "store": str(root / "store"), "auth": True, **record}
    (root / "server.json").write_text(json.dumps(rec))
    return proc


async def test_an_idle_server_of_an_older_hx_is_restarted_with_both_users(tmp_path: Path) -> None:
    old = old_single_user_server(tmp_path)
    try:
        async with connect(NatsSettings(data_dir=tmp_path)) as conn:  # the old data dir's password is the writer's
            await conn.log.append("hx.ledger.test", RunStarted(run_id="kept"))
            record = EmbeddedServer(tmp_path).record()
            assert record is not None and record.pid != old.pid and record.config
        assert old.proc is not None and old.proc.wait(10) is not None
        assert EmbeddedServer(tmp_path).credentials() == ("hx", "old-single-user-password")
        assert EmbeddedServer(tmp_path).auditor_credentials()[0] == AUDITOR_USER
        async with connect(NatsSettings(data_dir=tmp_path), auditor=True) as conn:
            assert [r.event async for r in conn.log.read(LEDGER.name)] == [RunStarted(run_id="kept")]
    finally:
        old.kill()


@pytest.mark.parametrize("how", ["in use", "foreground"])
def test_a_busy_server_of_an_older_hx_is_refused_in_one_line(
        tmp_path: Path, other_process: subprocess.Popen[bytes], how: str) -> None:
    old = old_single_user_server(tmp_path, foreground=how == "foreground")
    try:
        if how == "in use":
            (tmp_path / "nats" / "clients").mkdir()
            (tmp_path / "nats" / "clients" / f"{other_process.pid}-0123abcd").touch()
        line = error_line(hx("--data-dir", str(tmp_path), "log", "dump"))
        assert f"the nats-server for {tmp_path} (pid {old.pid}) was started with other users or permissions" in line
        assert ("stop that 'hx server'" if how == "foreground" else f"still use it (pid {other_process.pid})") in line
        assert old.proc is not None and old.proc.poll() is None  # left running for its clients
    finally:
        old.kill()


# --- the external server example in docs/streams.md ---------------------------------------------

def docs_config() -> str:
    """The nats-server configuration block of docs/streams.md, "Users and permissions"."""
    text = DOCS.read_text()
    [block] = re.findall(r"<!-- checked by tests/test_hardening_users.py -->\s*```\n(.*?)```", text, re.S)
    return str(block)


async def test_the_documented_external_server_config_gives_the_same_rights(tmp_path: Path) -> None:
    config = tmp_path / "hx.conf"
    config.write_text(docs_config())
    server = NatsProcess(tmp_path / "store", config=config)
    server.start(detach=False)
    users = dict(re.findall(r'user: "([^"]+)", password: "([^"]+)"', config.read_text()))
    assert set(users) == {WRITER_USER, AUDITOR_USER}
    documented = set(re.findall(r'"(\$JS[^"]*)"', config.read_text()))
    assert documented == set(WRITER_DENIED) | set(AUDITOR_PUBLISH)  # the docs say what hx gives its own server
    try:
        writer = NatsSettings(url=server.url, user=WRITER_USER, password=users[WRITER_USER],
                              auditor_user=AUDITOR_USER, auditor_password=users[AUDITOR_USER], ack_timeout=1.0)
        async with connect(writer) as conn:
            await conn.log.append("hx.ledger.test", RunStarted(run_id="external"))
            with pytest.raises(nats.errors.TimeoutError):
                await conn.js.delete_stream(LEDGER.name)
        async with connect(writer, auditor=True) as conn:
            assert [r.event async for r in conn.log.read(LEDGER.name)] == [RunStarted(run_id="external")]
        with pytest.raises(PermissionDenied, match=re.escape('user \'auditor\' to publish to "hx.ledger.forged"')):
            async with connect(writer, auditor=True) as conn:
                await conn.log.append("hx.ledger.forged", RunStarted(run_id="forged"))
    finally:
        server.stop()
