"""The embedded nats-server (start, join, leave, stale state) and connection settings."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import pytest

from schemas import RunStarted
from schemas.errors import HxError
from streams.config import DEFAULT_DATA_DIR, NatsSettings
from streams.connection import connect
from streams.errors import LogError, ServerError
from streams.processes import free_port, pid_alive, port_open
from streams.redaction import mask_url
from streams.server import EmbeddedServer, NatsProcess, ServerRecord, nats_server_binary
from streams.topology import BLOB_STORE, POSITIONS_BUCKET, STREAMS, trace_subject


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


@pytest.fixture
def cleanup() -> Iterator[list[EmbeddedServer]]:
    """Servers a test acquired; any still running at the end are stopped."""
    acquired: list[EmbeddedServer] = []
    yield acquired
    for server in acquired:
        rec = server.record()
        if rec is not None and pid_alive(rec.pid) and not rec.foreground:
            os.kill(rec.pid, 9)
        if server._started is not None:
            server._started.kill()


def without_credentials(url: str) -> str:
    """``nats://user:password@host:port`` -> ``nats://host:port``."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rsplit('@', 1)[-1]}"


def client_files(data_dir: Path) -> list[str]:
    d = data_dir / "nats" / "clients"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


async def connectable(url: str) -> bool:
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        return nc.is_connected and nc.connected_server_version.major >= 2
    finally:
        await nc.close()


# --- NatsProcess -------------------------------------------------------------------------


def test_binary_is_found() -> None:
    path = nats_server_binary()
    assert path.is_file() and os.access(path, os.X_OK)
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True)
    assert "nats-server" in out.stdout


async def test_nats_process_start_kill_and_stop(tmp_path: Path) -> None:
    proc = NatsProcess(tmp_path / "store")
    assert proc.url == f"nats://127.0.0.1:{proc.port}"
    with pytest.raises(ServerError):
        _ = proc.pid
    proc.start(detach=False)
    try:
        assert pid_alive(proc.pid) and port_open("127.0.0.1", proc.port)
        assert await connectable(proc.url)
        assert (tmp_path / "nats-server.log").read_text()
        pid = proc.pid
        proc.kill()
        assert not pid_alive(pid) and not port_open("127.0.0.1", proc.port)
        proc.start(detach=False)  # same store, same port
        assert proc.pid != pid and await connectable(proc.url)
    finally:
        proc.stop()
    assert not pid_alive(proc.pid)
    proc.stop()  # stopping twice is harmless


def test_nats_process_that_cannot_start_is_a_server_error(tmp_path: Path) -> None:
    # an address this machine does not have: the server cannot listen and exits at once
    proc = NatsProcess(tmp_path / "store", port=free_port(), host="192.0.2.1")
    with pytest.raises(ServerError, match="exited with code") as info:
        proc.start(detach=False)
    assert str(proc.log_path) in str(info.value)
    assert proc.log_path.read_text()


async def test_a_port_taken_before_the_server_binds_it_is_picked_again(tmp_path: Path, nats_server: NatsProcess,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Two processes may draw the same free port (tests run in parallel): the one that binds second
    # must not take the other's open port for its own, nor fail.
    taken = nats_server.port
    ours = NatsProcess(tmp_path / "ours" / "store", port=taken)
    with pytest.raises(ServerError, match=f"port {taken} on 127.0.0.1 is in use"):
        ours.start(detach=False)  # a port the caller named is not changed
    draws = iter([taken, taken, free_port()])
    monkeypatch.setattr("streams.server.free_port", lambda host="127.0.0.1": next(draws))
    chosen = NatsProcess(tmp_path / "chosen" / "store")
    try:
        chosen.start(detach=False)
        assert chosen.port != taken and chosen.proc is not None and chosen.proc.poll() is None
        assert chosen.log_path.read_text().count("address already in use") == 2
        nc = await nats.connect(chosen.url)
        assert nc.connected_url is not None and nc.connected_url.port == chosen.port
        await nc.close()
    finally:
        chosen.stop()


# --- EmbeddedServer ----------------------------------------------------------------------


async def test_acquire_join_release(tmp_path: Path, cleanup: list[EmbeddedServer]) -> None:
    first = EmbeddedServer(tmp_path)
    cleanup.append(first)
    url = first.acquire()
    assert url.startswith("nats://hx:") and "@127.0.0.1:" in url  # the data directory's credentials
    assert await connectable(url)
    rec = first.record()
    assert rec is not None and rec.url == without_credentials(url) and not rec.foreground and rec.auth
    assert json.loads((tmp_path / "nats" / "server.json").read_text())["pid"] == rec.pid
    assert (tmp_path / "nats" / "store").is_dir()
    assert len(client_files(tmp_path)) == 1
    assert client_files(tmp_path)[0].startswith(f"{os.getpid()}-")

    second = EmbeddedServer(tmp_path)
    cleanup.append(second)
    assert second.acquire() == url
    rec2 = second.record()
    assert rec2 is not None and rec2.pid == rec.pid
    assert len(client_files(tmp_path)) == 2

    first.release()  # the starter leaves first: the server stays for the other client
    assert pid_alive(rec.pid) and await connectable(url)
    assert len(client_files(tmp_path)) == 1
    assert second.record() == rec

    second.release()  # the last client leaves: the server stops
    wait_for(lambda: not pid_alive(rec.pid))
    assert not port_open("127.0.0.1", rec.port)
    assert second.record() is None
    assert not (tmp_path / "nats" / "server.json").exists()
    assert client_files(tmp_path) == []


async def test_starter_leaving_last_stops_its_own_child(tmp_path: Path, cleanup: list[EmbeddedServer]) -> None:
    first, second = EmbeddedServer(tmp_path), EmbeddedServer(tmp_path)
    cleanup.extend([first, second])
    url = first.acquire()
    assert second.acquire() == url
    rec = first.record()
    assert rec is not None
    second.release()
    assert pid_alive(rec.pid)
    first.release()
    wait_for(lambda: not pid_alive(rec.pid))
    assert first._started is None
    assert first.record() is None


async def test_reacquire_after_stop_starts_a_new_server_on_the_same_store(
    tmp_path: Path, cleanup: list[EmbeddedServer]
) -> None:
    server = EmbeddedServer(tmp_path)
    cleanup.append(server)
    url1 = server.acquire()
    pid1 = server.record().pid  # type: ignore[union-attr]
    server.release()
    wait_for(lambda: not pid_alive(pid1))
    url2 = server.acquire()
    assert await connectable(url2)
    assert server.record().pid != pid1  # type: ignore[union-attr]
    server.release()
    assert url1.startswith("nats://") and url2.startswith("nats://")


@pytest.mark.parametrize("stale", ["dead pid", "closed port", "garbage"])
async def test_stale_record_is_replaced(tmp_path: Path, cleanup: list[EmbeddedServer], stale: str,
                                        other_process: subprocess.Popen[bytes]) -> None:
    root = tmp_path / "nats"
    root.mkdir()
    record = root / "server.json"
    closed = free_port()
    if stale == "dead pid":
        record.write_text(json.dumps({"pid": dead_pid(), "host": "127.0.0.1", "port": closed}))
    elif stale == "closed port":  # the pid lives but is no nats-server and listens nowhere
        record.write_text(json.dumps({"pid": other_process.pid, "host": "127.0.0.1", "port": closed}))
    else:
        record.write_text("{not json")
    server = EmbeddedServer(tmp_path)
    cleanup.append(server)
    url = server.acquire()
    assert await connectable(url)
    rec = server.record()
    assert rec is not None and rec.alive()
    assert rec.pid != other_process.pid
    server.release()
    wait_for(lambda: not pid_alive(rec.pid))
    assert other_process.poll() is None  # the unrelated process was left alone


def test_server_record_alive() -> None:
    assert not ServerRecord(dead_pid(), "127.0.0.1", free_port()).alive()
    assert not ServerRecord(os.getpid(), "127.0.0.1", free_port()).alive()
    assert ServerRecord(1, "127.0.0.1", 4222, foreground=True).url == "nats://127.0.0.1:4222"


async def test_dead_clients_are_pruned(tmp_path: Path, cleanup: list[EmbeddedServer]) -> None:
    clients = tmp_path / "nats" / "clients"
    clients.mkdir(parents=True)
    (clients / f"{dead_pid()}-deadbeef").touch()
    (clients / "not-a-pid").touch()
    server = EmbeddedServer(tmp_path)
    cleanup.append(server)
    server.acquire()
    rec = server.record()
    assert rec is not None
    server.release()  # the dead clients do not keep the server alive
    wait_for(lambda: not pid_alive(rec.pid))
    assert client_files(tmp_path) == []


async def test_live_client_of_another_process_keeps_the_server(
    tmp_path: Path, cleanup: list[EmbeddedServer], other_process: subprocess.Popen[bytes]
) -> None:
    clients = tmp_path / "nats" / "clients"
    clients.mkdir(parents=True)
    (clients / f"{other_process.pid}-0ther").touch()
    server = EmbeddedServer(tmp_path)
    cleanup.append(server)
    url = server.acquire()
    rec = server.record()
    assert rec is not None
    server.release()
    assert pid_alive(rec.pid) and await connectable(url)  # the other process still uses it
    assert client_files(tmp_path) == [f"{other_process.pid}-0ther"]

    other_process.kill()
    other_process.wait()
    later = EmbeddedServer(tmp_path)
    cleanup.append(later)
    assert later.acquire() == url  # joined, not restarted
    later.release()  # the other process died without leaving: pruned, server stops
    wait_for(lambda: not pid_alive(rec.pid))
    assert client_files(tmp_path) == []


async def test_foreground_server_is_joined_but_not_stopped_by_clients(
    tmp_path: Path, cleanup: list[EmbeddedServer]
) -> None:
    fg = EmbeddedServer(tmp_path)
    port = free_port()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(fg.run_foreground(port=port)), daemon=True)
    thread.start()
    try:
        wait_for(lambda: (r := fg.record()) is not None and r.alive())
        rec = fg.record()
        assert rec is not None and rec.foreground and rec.port == port

        with pytest.raises(ServerError, match="already runs"):
            EmbeddedServer(tmp_path).run_foreground()

        client = EmbeddedServer(tmp_path)
        cleanup.append(client)
        url = client.acquire()
        assert without_credentials(url) == rec.url
        client.release()
        assert pid_alive(rec.pid) and await connectable(url)  # a client never stops it
    finally:
        rec = fg.record()
        if rec is not None:
            os.kill(rec.pid, 15)
        thread.join(10)
    assert not thread.is_alive()
    assert result and result[0] in (0, -15, 1)
    assert fg.record() is None


# --- connecting --------------------------------------------------------------------------


async def test_connect_without_url_uses_the_embedded_server(tmp_path: Path, cleanup: list[EmbeddedServer]) -> None:
    settings = NatsSettings(data_dir=tmp_path)
    assert settings.embedded
    async with connect(settings) as conn:
        assert conn.server is not None
        cleanup.append(conn.server)
        rec = conn.server.record()
        assert rec is not None and without_credentials(conn.url) == rec.url
        assert conn.nc.is_connected
        for spec in STREAMS:  # topology applied
            assert (await conn.js.stream_info(spec.name)).config.name == spec.name
        await conn.js.key_value(POSITIONS_BUCKET)
        await conn.js.object_store(BLOB_STORE)
        async with connect(settings) as other:  # a second connection joins the same server
            assert other.url == conn.url
            assert other.server is not None and other.server.record() == rec
            ack = await other.log.append(trace_subject("r"), RunStarted(run_id="r"), key="r#0")
        assert pid_alive(rec.pid)
        assert [r.seq for r in [x async for x in conn.log.read()]] == [ack.seq]
    wait_for(lambda: not pid_alive(rec.pid))
    assert client_files(tmp_path) == []

    # the data outlives the server: the next session reads it back
    async with connect(settings) as conn:
        assert conn.server is not None
        cleanup.append(conn.server)
        assert [r.event async for r in conn.log.read()] == [RunStarted(run_id="r")]
        assert (await conn.log.append(trace_subject("r"), RunStarted(run_id="r"), key="r#0")).duplicate


async def test_connect_without_applying_topology(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url), apply=False) as conn:
        assert await conn.js.streams_info() == []


async def test_the_ack_timeout_also_bounds_every_jetstream_request(nats_url: str) -> None:
    # HX_ACK_TIMEOUT is the one knob for a slow server: an API request (stream info, consumer
    # create) must wait as long as an append's ack does, not nats-py's fixed 5 s.
    async with connect(NatsSettings(url=nats_url, ack_timeout=1e-6), apply=False) as conn:
        with pytest.raises(nats.errors.TimeoutError):
            await conn.js.streams_info()
    async with connect(NatsSettings(url=nats_url, ack_timeout=5.0), apply=False) as conn:
        assert await conn.js.streams_info() == []


def test_settings_from_env(tmp_path: Path) -> None:
    env = {
        "HX_NATS_URL": "nats://nats.example:4222",
        "HX_DATA_DIR": str(tmp_path / "data"),
        "HX_NATS_USER": "alice",
        "HX_NATS_PASSWORD": "pa55-w0rd-xyz",
        "HX_NATS_TOKEN": "t0ken-abc-123",
        "HX_NATS_CREDS": "/etc/hx/user.creds",
        "HX_NATS_TLS_CA": "/etc/hx/ca.pem",
        "HX_ACK_TIMEOUT": "2.5",
    }
    s = NatsSettings.from_env(env)
    assert s.url == "nats://nats.example:4222" and not s.embedded
    assert s.data_dir == tmp_path / "data" and isinstance(s.data_dir, Path)
    assert (s.user, s.password, s.token) == ("alice", "pa55-w0rd-xyz", "t0ken-abc-123")
    assert s.creds_file == "/etc/hx/user.creds" and s.tls_ca == "/etc/hx/ca.pem"
    assert s.ack_timeout == 2.5
    opts = dataclasses.replace(s, tls_ca=None).connect_options()  # no CA file exists here
    assert opts == {"user": "alice", "password": "pa55-w0rd-xyz", "token": "t0ken-abc-123",
                    "user_credentials": "/etc/hx/user.creds"}
    for text in (repr(s), str(s), f"{s}", repr([s])):
        assert "pa55-w0rd-xyz" not in text and "t0ken-abc-123" not in text
        assert "alice" in text and "nats.example" in text

    # empty variables mean unset; overrides win; strings become paths
    d = NatsSettings.from_env({"HX_NATS_URL": "", "HX_NATS_PASSWORD": ""}, data_dir=str(tmp_path), url=None)
    assert d.url is None and d.embedded and d.password is None and d.data_dir == tmp_path
    assert d.ack_timeout == 5.0 and d.connect_options() == {}
    assert NatsSettings.from_env({}).data_dir == Path(DEFAULT_DATA_DIR)
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(LogError, match=f"HX_ACK_TIMEOUT must be a positive number of seconds, not '{bad}'"):
            NatsSettings.from_env({"HX_ACK_TIMEOUT": bad})


def test_settings_from_process_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("HX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HX_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HX_NATS_URL", "nats://bob:hunter2-secret@10.0.0.1:4222")
    s = NatsSettings.from_env()
    assert s.data_dir == tmp_path and s.url == "nats://bob:hunter2-secret@10.0.0.1:4222"
    assert "hunter2-secret" not in repr(s)  # credentials inside the URL are hidden too
    assert "10.0.0.1:4222" in repr(s)


@pytest.mark.parametrize(("url", "shown"), [
    ("nats://u:p@h:4222", "nats://***@h:4222"),
    ("nats://token@h:4222", "nats://***@h:4222"),
    ("nats://u:p@ss@h:4222", "nats://***@h:4222"),
    ("u:p@h:4222", "***@h:4222"),
    ("nats://h:4222", "nats://h:4222"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


async def test_wrong_url_is_a_log_error_without_the_password() -> None:
    port = free_port()
    settings = NatsSettings.from_env({"HX_NATS_URL": f"nats://alice:s3cret-pw@127.0.0.1:{port}"})
    t0 = time.monotonic()
    with pytest.raises(LogError) as info:
        async with connect(settings):
            pass
    assert time.monotonic() - t0 < 5.0  # fails fast instead of reconnecting forever
    assert isinstance(info.value, HxError)
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text
    assert "s3cret-pw" not in text and "alice" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[str]:
    """A nats-server with JetStream that wants user 'hx' with password 'letmein-123'."""
    port = free_port()
    proc = subprocess.Popen([str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port), "-js",
                             "-sd", str(tmp_path / "auth-store"), "--user", "hx", "--pass", "letmein-123"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_open("127.0.0.1", port))
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_credentials_reach_the_server(auth_server: str) -> None:
    env = {"HX_NATS_URL": f"nats://{auth_server}", "HX_NATS_USER": "hx", "HX_NATS_PASSWORD": "letmein-123"}
    async with connect(NatsSettings.from_env(env)) as conn:
        assert (await conn.log.append(trace_subject("r"), RunStarted(run_id="r"))).seq == 1
    async with connect(NatsSettings.from_env({"HX_NATS_URL": f"nats://hx:letmein-123@{auth_server}"})) as conn:
        assert await conn.log.last_seq() == 1


async def test_wrong_password_is_a_log_error_without_the_password(auth_server: str) -> None:
    for env in ({"HX_NATS_URL": f"nats://{auth_server}", "HX_NATS_USER": "hx", "HX_NATS_PASSWORD": "wr0ng-pw"},
                {"HX_NATS_URL": f"nats://hx:wr0ng-pw@{auth_server}"}):
        t0 = time.monotonic()
        with pytest.raises(LogError) as info:
            async with connect(NatsSettings.from_env(env)):
                pass
        assert time.monotonic() - t0 < 5.0
        assert auth_server in str(info.value)
        assert "wr0ng-pw" not in str(info.value)
