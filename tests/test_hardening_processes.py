"""Processes: hx signals only its own nats-server, fails fast when it dies, and ends cleanly on Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from hx.aegis.ledger import read_records
from schemas.ledger import CandidateProposed, EvolutionFinished, GateJudged, LedgerEvent, RoundDecided
from schemas.lifecycle import RunFinished
from streams.config import NatsSettings
from streams.connection import connect
from streams.errors import LogError, ServerGone
from streams.processes import free_port, pid_alive, process_args, process_start
from streams.server import EmbeddedServer
from streams.topology import LEDGER, TRACE, trace_subject


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something else listens on (the recorded port, reused by another program)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_stale_record_naming_another_process_is_never_signalled(
        tmp_path: Path, other_process: subprocess.Popen[bytes], listener: int) -> None:
    root = tmp_path / "nats"
    root.mkdir()
    stale = {"pid": other_process.pid, "host": "127.0.0.1", "port": listener, "foreground": False, "auth": True,
             "started": process_start(other_process.pid), "store": str(root / "store")}
    (root / "server.json").write_text(json.dumps(stale))
    assert EmbeddedServer(tmp_path).record() is not None
    EmbeddedServer(tmp_path).release()  # a process leaving: it must not stop what the record names
    assert other_process.poll() is None

    (root / "server.json").write_text(json.dumps(stale))
    server = EmbeddedServer(tmp_path)
    server.acquire()  # not joined: the pid is no nats-server of this store, so a new server starts
    try:
        record = server.record()
        assert record is not None and record.pid != other_process.pid and record.is_ours()
        args = process_args(record.pid)
        assert args is not None and str(server.store_dir) in args
    finally:
        server.release()
    wait_for(lambda: not pid_alive(record.pid))
    assert other_process.poll() is None


def test_a_reused_pid_is_told_apart_by_its_start_time(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path)
    server.acquire()
    try:
        record = server.record()
        assert record is not None and record.is_ours()
        moved = dict(json.loads(server.record_path.read_text()), started=(record.started or 0) + 1)
        server.record_path.write_text(json.dumps(moved))
        assert not EmbeddedServer(tmp_path).record().is_ours()  # type: ignore[union-attr]
        server.record_path.write_text(json.dumps(dict(moved, started=record.started)))
    finally:
        server.release()


# --- a running ``hx run`` ------------------------------------------------------------------

def start_hx_run(data_dir: Path, run_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HX_DATA_DIR": str(data_dir)}
    env.pop("HX_NATS_URL", None)
    # A session of its own: signals go to its process group, as a terminal's Ctrl-C would. 10,000 attempts,
    # more than any test lets finish, so a start slowed by load cannot race the signal (conftest.py makes
    # sure the run does not inherit SIGINT ignored).
    return subprocess.Popen([sys.executable, "-m", "hx", "run", "--tasks", "200", "--attempts", "50",
                             "--run-id", run_id], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


async def _first_attempt_frame(url: str, run_id: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        seen = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Msg) -> None:
            if not msg.subject.endswith("._._") and not seen.done():
                seen.set_result(msg.subject)
        await nc.subscribe(f"hx.trace.{run_id}.*.*.*", cb=on_msg)
        await asyncio.wait_for(seen, 120)
    finally:
        await nc.close()


def wait_until_attempts_are_logged(data_dir: Path, run_id: str, proc: subprocess.Popen[str]) -> int:
    """Block until the run's first attempt frame is on the log; return the server's pid."""
    embedded = EmbeddedServer(data_dir)
    wait_for(lambda: proc.poll() is None and (r := embedded.record()) is not None and r.alive())
    record = embedded.record()
    assert record is not None
    user, password = embedded.credentials()
    asyncio.run(_first_attempt_frame(f"nats://{user}:{password}@{record.host}:{record.port}", run_id))
    return record.pid


def game_jvms(pid: int) -> list[int]:
    """The JVMs a process started (its java children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        args = process_args(int(entry.name)) or []
        if ppid == pid and args and Path(args[0]).name == "java":
            found.append(int(entry.name))
    return found


def run_finished(data_dir: Path, run_id: str) -> RunFinished:
    async def read() -> RunFinished:
        async with connect(NatsSettings(data_dir=data_dir)) as conn:
            [record] = [r async for r in conn.log.read(TRACE.name, subjects=[trace_subject(run_id)],
                                                       types=[RunFinished.TYPE])]
            assert isinstance(record.event, RunFinished)
            return record.event
    return asyncio.run(read())


@pytest.mark.slow
def test_a_dead_embedded_server_ends_the_run_at_once_with_one_message(tmp_path: Path) -> None:
    proc = start_hx_run(tmp_path, "orphaned")
    try:
        server_pid = wait_until_attempts_are_logged(tmp_path, "orphaned", proc)
        os.kill(server_pid, signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - killed
    assert proc.returncode == 1, err
    assert took < 10, f"took {took:.1f}s to notice"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: the embedded nats-server for {tmp_path} exited; see {tmp_path / 'nats'}"
                      f"/nats-server.log"], err
    assert err.count("warning") <= 1 and "Traceback" not in err


async def kill_while_busy(data_dir: Path) -> None:
    """Connect, keep tasks asking the server things, SIGKILL the server; raises what the connection raises."""
    async with connect(NatsSettings(data_dir=data_dir)) as conn:
        asked = 0
        busy = asyncio.Event()
        stopping = False
        # The loops also stop on a flag: on Python 3.11, asyncio.wait_for (inside nats-py's request) loses a
        # cancellation that arrives as its future completes, and a loop that then suppresses the error it got
        # instead would ask forever (the finally's gather below never returned, now and then).

        async def ask() -> None:  # what attempts do: ask the server something, again and again
            nonlocal asked
            while not stopping:
                with contextlib.suppress(LogError, nats.errors.Error, TimeoutError):
                    await conn.log.last_subject_seq("hx.ledger.x", LEDGER.name)
                asked += 1
                if asked >= 50:
                    busy.set()
                await asyncio.sleep(0)  # a turn for the others, not a wait

        async def send() -> None:  # and the first half of a request, once a turn: buffered while reconnecting
            while not stopping:
                with contextlib.suppress(nats.errors.Error):
                    await conn.nc.publish("hx.nothing", b"a request")
                await asyncio.sleep(0)
        tasks = [asyncio.create_task(ask()) for _ in range(4)] + [asyncio.create_task(send())]
        try:
            await busy.wait()
            record = EmbeddedServer(data_dir).record()
            assert record is not None
            os.kill(record.pid, signal.SIGKILL)
            await asyncio.Event().wait()  # until the connection's watch ends this with ServerGone
        finally:
            stopping = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_connection_busy_when_its_embedded_server_dies_ends_with_server_gone_and_nothing_else(
        tmp_path: Path) -> None:
    """The race behind the test above failing now and then: requests buffered while nats-py reconnects.

    nats-py's close flushes them to the lost socket and raises; closed in a task nobody kept or
    awaited, that was "Task exception was never retrieved" (a traceback on stderr), and the close
    stopped half way, leaving nats-py's tasks pending. A request sent every turn of the loop is
    buffered while nats-py reconnects, so each of the five deaths here meets it.
    """
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _, context: reported.append(str(context.get("message"))))
    try:
        for i in range(5):
            with pytest.raises(ServerGone):
                await kill_while_busy(tmp_path / str(i))
            left = asyncio.all_tasks() - {asyncio.current_task()}
            if left:  # nats-py's own tasks end once the connection is closed (10 s bounds a hang, not a race)
                _, pending = await asyncio.wait(left, timeout=10)
                assert not pending, pending
            gc.collect()  # a task that died with its exception unretrieved is reported when collected
        assert reported == []
    finally:
        loop.set_exception_handler(None)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code", "group"), [(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)])
def test_ctrl_c_or_sigterm_ends_the_run_cleanly(tmp_path: Path, sig: signal.Signals, code: int, group: bool) -> None:
    proc = start_hx_run(tmp_path, "stopped")
    try:
        wait_until_attempts_are_logged(tmp_path, "stopped", proc)
        jvms = game_jvms(proc.pid)
        assert jvms, "the run should be playing games in JVMs by now"
        assert proc.poll() is None, "the run ended before it could be signalled"
        if group:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C reaches the whole foreground group
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "Py4J" not in err and "Exception" not in err, err
    assert all(not pid_alive(jvm) for jvm in jvms), "the game JVMs outlived the run"
    finished = run_finished(tmp_path, "stopped")
    assert finished.status == "cancelled"
    assert finished.reason == ("cancelled (SIGTERM)" if sig == signal.SIGTERM else "cancelled")
    assert free_port()  # and the machine is left usable


# --- a running ``hx evolve`` / ``hx coevolve`` stopped by SIGTERM or Ctrl-C ------------------------

TOY_HX = "import runpy, toyworld; runpy.run_module('hx', run_name='__main__', alter_sys=True)"
"""``python -m hx`` with the toy world registered first (tests/ on PYTHONPATH): the real command, a test bench."""


async def first_decision(url: str, proc: asyncio.subprocess.Process) -> None:
    """Block until round 0's decision is on the ledger; fail if the process ends first."""
    async with connect(NatsSettings(url=url)) as conn:
        async def decided() -> None:
            async for _ in conn.log.subscribe(LEDGER.name, types=(RoundDecided.TYPE,)):
                return

        watch, died = asyncio.create_task(decided()), asyncio.create_task(proc.wait())
        done, _ = await asyncio.wait({watch, died}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        for task in (watch, died):
            task.cancel()
        await asyncio.gather(watch, died, return_exceptions=True)
        assert watch in done, "the run ended (or took too long) before round 0 was decided"


async def ledger_of(url: str, run_id: str) -> list[LedgerEvent]:
    async with connect(NatsSettings(url=url)) as conn:
        records = await read_records(conn, run_id)
    assert records is not None
    return records


@pytest.mark.slow
@pytest.mark.parametrize(("command", "sig", "why", "code"), [
    pytest.param("evolve", signal.SIGTERM, "SIGTERM", 143, id="evolve-sigterm"),
    pytest.param("evolve", signal.SIGINT, "Ctrl-C", 130, id="evolve-ctrl-c"),
    pytest.param("coevolve", signal.SIGTERM, "SIGTERM", 143, id="coevolve-sigterm")])
async def test_a_stopped_evolution_says_what_its_ledger_keeps_and_how_to_resume(
        nats_url: str, tmp_path: Path, command: str, sig: signal.Signals, why: str, code: int) -> None:
    run_id = f"stopped-{command}-{sig.name.lower()}"
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HX_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    # Twelve rounds: far more than the moments between round 0's decision and the signal can run.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", TOY_HX, "--nats-url", nats_url, "--data-dir", str(data), command,
        "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "8", "--heldout-tasks", "2",
        "--rounds", "12", "--patience", "12", "--max-steps", "20", "--seed", "3", "--run-id", run_id,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        await first_decision(nats_url, proc)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C reaches the whole foreground group
        else:
            proc.send_signal(sig)
        _, raw = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = raw.decode()
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    records = await ledger_of(nats_url, run_id)  # the truth the note must tell
    assert not any(isinstance(r, EvolutionFinished) for r in records)
    decided = max(r.round for r in records if isinstance(r, RoundDecided))
    kept = "round 0 decided" if decided == 0 else f"rounds 0..{decided} decided"
    [line] = [line for line in err.splitlines() if line.startswith("stopped by")]
    assert line.startswith(f"stopped by {why}: the ledger of {run_id} keeps the held-out score before round 0"), line
    assert f" {kept}" in line, line
    assert line.endswith(f"; resume with: hx {command} --resume {run_id}"), line
    upcoming = [r for r in records if getattr(r, "round", None) == decided + 1]
    candidates = sum(isinstance(r, CandidateProposed) for r in upcoming)
    verdicts = sum(isinstance(r, GateJudged) for r in upcoming)
    for count, word in ((candidates, "candidate"), (verdicts, "gate verdict")):
        if count:
            assert f"{count} {word}" in line, line
    assert (f"round {decided + 1}'s" in line) == bool(upcoming), line
    assert line == err.strip().splitlines()[-1], err  # the last word on stderr

    if command == "evolve" and sig == signal.SIGTERM:  # and the resume it names finishes the run
        resumed = await asyncio.create_subprocess_exec(
            sys.executable, "-c", TOY_HX, "--nats-url", nats_url, "--data-dir", str(data),
            *line.rpartition("resume with: hx ")[2].split(), "--json", env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, raw = await asyncio.wait_for(resumed.communicate(), 120)
        assert resumed.returncode == 0, raw.decode()
        assert [row["round"] for row in json.loads(out)["rounds"]] == list(range(12))
