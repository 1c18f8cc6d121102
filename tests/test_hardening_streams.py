"""Stream integrity: settings that could lose events, lost events, a deleted ledger, the embedded server's password."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
from hx_cli import hx
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from schemas.integrity import StreamLossAccepted
from schemas.lifecycle import RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.errors import StreamLoss, TopologyMismatch
from streams.integrity import HEADS_BUCKET, StreamHead
from streams.processes import process_args
from streams.server import EmbeddedServer, NatsProcess
from streams.topology import LEDGER, POSITIONS_BUCKET, TRACE, StreamSpec, apply_topology


async def ledger_events(settings: NatsSettings, n: int, first: int = 0) -> None:
    """Append ``n`` ledger events (numbered from ``first``) through hx, which moves the ledger's head."""
    async with connect(settings) as conn:
        for i in range(first, first + n):
            await conn.log.append("hx.ledger.test", RunStarted(run_id=f"edit-{i}"))


@contextlib.asynccontextmanager
async def as_owner(data_dir: Path) -> AsyncIterator[JetStreamContext]:
    """The store of ``data_dir``'s embedded server served with no users: what the owner of the files can always do.

    hx's own users may not delete, purge or update the ledger; a test that plays someone
    tampering with it stops hx's server (its last client left) and opens the store directly.
    """
    embedded = EmbeddedServer(data_dir)
    assert embedded.record() is None, "hx's server still runs on this store"
    proc = NatsProcess(embedded.store_dir)
    proc.start(detach=False)
    try:
        nc = await nats.connect(proc.url)
        try:
            yield nc.jetstream()
        finally:
            await nc.close()
    finally:
        proc.stop()


async def server_head(js: JetStreamContext, stream: str) -> StreamHead:
    entry = await (await js.key_value(HEADS_BUCKET)).get(stream)
    assert entry.value is not None
    return msgspec.json.decode(entry.value, type=StreamHead)


# --- settings that could lose events -----------------------------------------------------

@pytest.mark.parametrize(("stream", "setting", "value"), [
    (LEDGER, "max_msgs", 10), (LEDGER, "max_bytes", 1 << 20), (LEDGER, "max_msgs_per_subject", 5),
    (LEDGER, "max_msg_size", 1024), (LEDGER, "max_age", 3600.0), (LEDGER, "discard", "new"),
    (LEDGER, "allow_msg_ttl", True), (TRACE, "allow_rollup_hdrs", True),  # the server allows no rollup on the ledger
    (TRACE, "max_msgs", 1000), (TRACE, "deny_delete", True),
])
async def test_a_setting_that_could_lose_events_is_refused_by_name(
        client: tuple[NATS, JetStreamContext], stream: StreamSpec, setting: str, value: Any) -> None:
    _, js = client
    await apply_topology(js)
    await js.publish(stream.subjects[0].replace(">", "x"), b"an event")
    changed = dataclasses.replace((await js.stream_info(stream.name)).config, **{setting: value})
    await js.update_stream(changed)
    with pytest.raises(TopologyMismatch, match=rf"stream {stream.name} .*{setting}: declared .*, found") as info:
        await apply_topology(js)
    assert "(" in str(info.value)  # each difference says what it risks
    after = await js.stream_info(stream.name)
    assert getattr(after.config, setting) == value and after.state.messages == 1  # left alone


async def test_a_bucket_setting_that_could_lose_entries_is_refused(client: tuple[NATS, JetStreamContext]) -> None:
    _, js = client
    await apply_topology(js)
    name = f"KV_{POSITIONS_BUCKET}"
    await js.update_stream(dataclasses.replace((await js.stream_info(name)).config, max_bytes=4096))
    with pytest.raises(TopologyMismatch, match=rf"stream {name} .*max_bytes: declared 'unlimited', found 4096"):
        await apply_topology(js)


# --- events lost --------------------------------------------------------------------------

async def test_events_evicted_from_the_ledger_are_found_even_after_the_limit_is_undone(
        client: tuple[NATS, JetStreamContext], nats_url: str) -> None:
    _, js = client
    await ledger_events(NatsSettings(url=nats_url), 5)
    config = (await js.stream_info(LEDGER.name)).config
    await js.update_stream(dataclasses.replace(config, max_msgs=2))  # evicts three edits
    await js.update_stream(dataclasses.replace(config, max_msgs=-1))  # and hides the setting again
    with pytest.raises(StreamLoss, match="stream HX_LEDGER lost 3 events: it holds 2 of the 5 ever appended"):
        await apply_topology(js)


async def test_every_ledger_append_moves_its_head(client: tuple[NATS, JetStreamContext], nats_url: str) -> None:
    _, js = client
    await ledger_events(NatsSettings(url=nats_url), 3)
    head = await server_head(js, LEDGER.name)
    info = await js.stream_info(LEDGER.name)
    assert (head.last_seq, head.messages) == (3, 3) == (info.state.last_seq, info.state.messages)
    assert info.created is not None
    assert head.created == info.created.isoformat()


async def test_a_deleted_ledger_is_not_recreated_empty(client: tuple[NATS, JetStreamContext], nats_url: str) -> None:
    _, js = client
    await ledger_events(NatsSettings(url=nats_url), 4)
    await js.delete_stream(LEDGER.name)
    with pytest.raises(StreamLoss, match=r"stream HX_LEDGER is gone, but held 4 events \(up to sequence 4\)"):
        await apply_topology(js)
    assert LEDGER.name not in [s.config.name for s in await js.streams_info()]  # still gone: refused, not recreated


async def test_a_ledger_deleted_and_refilled_is_told_apart(client: tuple[NATS, JetStreamContext],
                                                           nats_url: str) -> None:
    _, js = client
    await ledger_events(NatsSettings(url=nats_url), 2)
    await js.delete_stream(LEDGER.name)
    await js.add_stream(LEDGER.config())
    for i in range(5):  # more events than before: a sequence check alone would pass
        await js.publish("hx.ledger.x", f"forged {i}".encode())
    with pytest.raises(StreamLoss, match="stream HX_LEDGER was deleted and recreated"):
        await apply_topology(js)


async def test_the_embedded_servers_heads_outlive_a_deleted_heads_bucket(tmp_path: Path) -> None:
    settings = NatsSettings(data_dir=tmp_path)
    await ledger_events(settings, 3)
    assert json.loads((tmp_path / "heads.json").read_text())[LEDGER.name]["last_seq"] == 3
    async with as_owner(tmp_path) as js:  # someone deletes the ledger and the heads with it
        await js.delete_stream(LEDGER.name)
        await js.delete_key_value(HEADS_BUCKET)
    with pytest.raises(StreamLoss, match=rf"HX_LEDGER is gone, but held 3 events .*kept in {tmp_path}"):
        async with connect(settings):
            pass


def test_verify_names_the_loss_and_accept_loss_records_it_on_the_ledger(tmp_path: Path) -> None:
    import asyncio

    settings = NatsSettings(data_dir=tmp_path)
    asyncio.run(ledger_events(settings, 3))

    async def evict() -> None:
        async with as_owner(tmp_path) as js:
            config = (await js.stream_info(LEDGER.name)).config
            await js.update_stream(dataclasses.replace(config, max_msgs=1))
    asyncio.run(evict())

    refused = hx("--data-dir", str(tmp_path), "log", "dump")
    assert refused.exit_code == 1 and "setting max_msgs" not in refused.stderr
    assert "max_msgs: declared 'unlimited', found 1" in refused.stderr.splitlines()[-1]
    verified = hx("--data-dir", str(tmp_path), "log", "verify")
    assert verified.exit_code == 1 and "HX_LEDGER" in verified.stdout and "lost 2 events" in verified.stdout
    risky = hx("--data-dir", str(tmp_path), "log", "accept-loss", "HX_LEDGER", "--reason", "test")
    assert risky.exit_code == 1 and "a loss can be accepted, a risk cannot" in risky.stderr

    async def undo_limit() -> None:
        async with as_owner(tmp_path) as js:
            config = (await js.stream_info(LEDGER.name)).config
            await js.update_stream(dataclasses.replace(config, max_msgs=-1))
    asyncio.run(undo_limit())
    assert "lost 2 events" in hx("--data-dir", str(tmp_path), "log", "dump").stderr
    accepted = hx("--data-dir", str(tmp_path), "log", "accept-loss", "HX_LEDGER", "--reason", "evicted by a test")
    assert accepted.exit_code == 0, accepted.output
    assert hx("--data-dir", str(tmp_path), "log", "verify").exit_code == 0
    dumped = hx("--data-dir", str(tmp_path), "log", "dump", "--stream", LEDGER.name, "--type", StreamLossAccepted.TYPE)
    [line] = [json.loads(x) for x in dumped.stdout.splitlines()]
    assert line["event"]["reason"] == "evicted by a test" and line["event"]["accepted_missing"] == 2
    assert "lost 2 events" in line["event"]["problems"][0]


# --- the embedded server's password ------------------------------------------------------

async def test_the_embedded_server_demands_the_data_directorys_password(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path)
    url = server.acquire()
    try:
        record = server.record()
        assert record is not None and record.auth
        with pytest.raises(nats.errors.Error):  # another local process, without the credentials
            await nats.connect(record.url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
        nc = await nats.connect(url, allow_reconnect=False)
        await nc.close()
        user, password = server.credentials()
        wrong = url.replace(password, "guessed-password")
        with pytest.raises(nats.errors.Error):
            await nats.connect(wrong, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
        for path in (server.credentials_path, server.config_path):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(server.root.stat().st_mode) == 0o700
        args = process_args(record.pid)
        assert args is not None and password not in " ".join(args)  # other users can read a command line
        assert json.loads(server.credentials_path.read_text()) == {"user": user, "password": password}
    finally:
        server.release()


async def test_the_password_stays_the_same_across_restarts(tmp_path: Path) -> None:
    settings = NatsSettings(data_dir=tmp_path)
    async with connect(settings) as conn:
        await conn.log.append(TRACE.subjects[0].replace(">", "r._._._"), RunStarted(run_id="r"))
        first = EmbeddedServer(tmp_path).credentials()
    async with connect(settings) as conn:  # a new server process on the same store and credentials
        assert [r.event async for r in conn.log.read()] == [RunStarted(run_id="r")]
    assert EmbeddedServer(tmp_path).credentials() == first


async def test_a_store_restored_from_an_older_backup_is_found_truncated(tmp_path: Path) -> None:
    """Same stream (same creation time), fewer events: the ledger edits made since the backup are gone."""
    settings = NatsSettings(data_dir=tmp_path)
    store = tmp_path / "nats" / "store"
    await ledger_events(settings, 2)  # the last client leaves: the server stops, the store is at rest
    shutil.copytree(store, tmp_path / "backup")
    await ledger_events(settings, 3, first=2)
    shutil.rmtree(store)
    shutil.copytree(tmp_path / "backup", store)
    with pytest.raises(StreamLoss, match="stream HX_LEDGER was truncated: its last sequence is 2, but hx saw 5"):
        async with connect(settings):
            pass
