"""D5 execution environment: a subprocess sandbox that runs Python code for the agent.

``PythonSandboxTool`` runs each call's code in a fresh ``python -I`` subprocess:

- time: a wall-clock limit (the whole process group is killed) plus ``RLIMIT_CPU``;
- memory: ``RLIMIT_AS`` set in the child before exec, so a huge allocation fails with
  ``MemoryError`` (or the child dies) instead of exhausting the host;
- files: ``RLIMIT_FSIZE`` caps any file written; no core dumps;
- network: with ``network="auto"`` the child runs under ``unshare --net`` (a new network
  namespace with only a loopback that is down) when this host permits it (root, or
  unprivileged user namespaces via ``--map-root-user``); otherwise a guard installed
  before the code runs makes every non-Unix socket and DNS lookup raise
  ``PermissionError``. ``ToolResult.data["network"]`` says which was used. The guard
  is best effort: it stops Python's socket API, not a program started with ``os.exec``
  or raw ``ctypes`` calls (the ``subprocess_sandbox`` processor refuses code that
  imports those);
- environment: a minimal one (no API keys or tokens of the parent leak in), a fixed
  ``PYTHONHASHSEED``, ``HOME`` and ``TMPDIR`` inside the workspace;
- directory: the attempt's workspace (``attempt_workspace``), or, without that
  processor, a private temporary directory the tool creates and removes itself.

When hx runs as root the child could raise its own limits again (root may raise hard
limits): for untrusted code run hx as an unprivileged user or in a container.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any, Literal

import msgspec

from hx.processors.attempt_workspace import current_workspace
from hx.runtime.task import Tool
from schemas.messages import ToolCall, ToolResult, ToolSchema

NetworkMode = Literal["auto", "unshare", "guard", "allow"]
"""How network access is blocked: best available, namespace only, socket guard only, or not at all."""

_UNSHARE_VARIANTS: tuple[tuple[str, ...], ...] = (
    ("unshare", "--net", "--"),
    ("unshare", "--user", "--map-root-user", "--net", "--"),
)

_GUARD = r'''
import _socket, socket
_deny_msg = "network access is disabled in the hx sandbox"
def _deny(*args, **kwargs):
    raise PermissionError(13, _deny_msg)
_Real = _socket.socket
class _GuardedSocket(_Real):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if family != _socket.AF_UNIX:
            _deny()
        _Real.__init__(self, family, type, proto, fileno)
# socket.socket.__init__ looks up _socket.socket at call time, so this guards it too
_socket.socket = _socket.SocketType = _GuardedSocket
for _name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo",
              "create_connection", "create_server", "fromfd"):
    for _mod in (_socket, socket):
        if hasattr(_mod, _name):
            setattr(_mod, _name, _deny)
del _name, _mod
'''

_RUN = r'''
import linecache, os, sys
_src = sys.stdin.read()
sys.stdin = open(os.devnull)
sys.path.insert(0, os.getcwd())
linecache.cache["<sandbox>"] = (len(_src), None, _src.splitlines(True), "<sandbox>")
_code = compile(_src, "<sandbox>", "exec")
del _src
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


@functools.cache
def unshare_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` invocation that gives a child an empty network namespace here, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in _UNSHARE_VARIANTS:
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return None


class SandboxLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource limits of one sandboxed run."""

    timeout_s: float = 10.0
    """Wall-clock limit; the process group is killed when it passes."""
    memory_mb: int = 512
    """Address-space limit (``RLIMIT_AS``) of the child, in MiB."""
    max_file_mb: int = 64
    """Largest file the child may write (``RLIMIT_FSIZE``), in MiB."""
    max_output_chars: int = 10_000
    """Stdout and stderr are each cut to this many characters."""
    network: NetworkMode = "auto"


class SandboxRun(msgspec.Struct, frozen=True, kw_only=True):
    """What one sandboxed run produced."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The child's exit status; negative for a signal; None when the wall clock killed it."""
    timed_out: bool = False
    memory_exceeded: bool = False
    truncated: bool = False
    network: str = ""
    """How the network was blocked: ``unshare``, ``guard`` or ``allow``."""


def _limit_child(limits: SandboxLimits, cpu_s: int) -> None:
    """Runs in the child between fork and exec: apply the resource limits."""
    mem = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    size = limits.max_file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child_env(workspace: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workspace),
        "TMPDIR": str(workspace),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


async def _drain(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bool]:
    """Read a pipe to its end, keeping the first ``cap`` bytes (the rest is discarded, not buffered)."""
    if stream is None:
        return b"", False
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True
    return bytes(kept), truncated


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_python(code: str, workspace: Path, limits: SandboxLimits, *,
                     python: str = sys.executable) -> SandboxRun:
    """Run ``code`` in a limited subprocess with ``workspace`` as its directory."""
    mode = limits.network
    prefix: tuple[str, ...] = ()
    if mode in ("auto", "unshare"):
        # Probing runs up to two subprocesses (once per process, cached): not on the event loop.
        found = await asyncio.to_thread(unshare_prefix)
        if found is not None:
            prefix, mode = found, "unshare"
        elif mode == "unshare":
            raise RuntimeError("network='unshare' was asked for, but 'unshare --net' is not permitted here")
        else:
            mode = "guard"
    bootstrap = (_GUARD if mode == "guard" else "") + _RUN
    cpu_s = max(1, math.ceil(limits.timeout_s))
    proc = await asyncio.create_subprocess_exec(
        *prefix, python, "-I", "-c", bootstrap,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=workspace, env=_child_env(workspace), start_new_session=True,
        preexec_fn=functools.partial(_limit_child, limits, cpu_s),
    )
    cap = limits.max_output_chars * 4  # utf-8 bytes; cut to characters after decoding
    readers = asyncio.gather(_drain(proc.stdout, cap), _drain(proc.stderr, cap))
    timed_out = False

    async def feed_and_wait() -> None:
        assert proc.stdin is not None
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the child may exit early
                proc.stdin.write(code.encode())
                await proc.stdin.drain()
        finally:
            proc.stdin.close()
        await proc.wait()

    try:
        await asyncio.wait_for(feed_and_wait(), timeout=limits.timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        _kill_group(proc.pid)  # also ends anything the code started in its session
        await proc.wait()
    try:
        (out, out_cut), (err, err_cut) = await asyncio.wait_for(readers, timeout=2.0)
    except TimeoutError:  # a grandchild escaped the group and holds the pipes open
        readers.cancel()
        (out, out_cut), (err, err_cut) = (b"", True), (b"", True)
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    truncated = out_cut or err_cut or len(stdout) > limits.max_output_chars or len(stderr) > limits.max_output_chars
    code_ = None if timed_out else proc.returncode
    # RLIMIT_CPU's SIGXCPU is the same time limit counted in CPU seconds: on an idle machine a
    # busy loop reaches it as the wall clock does, so either may strike first.
    timed_out = timed_out or code_ == -signal.SIGXCPU
    return SandboxRun(stdout=stdout[:limits.max_output_chars], stderr=stderr[:limits.max_output_chars],
                      exit_code=code_, timed_out=timed_out, truncated=truncated, network=mode,
                      memory_exceeded=not timed_out and code_ != 0 and "MemoryError" in stderr)


def render(run: SandboxRun, limits: SandboxLimits) -> str:
    """The text the model sees for one run."""
    parts = []
    if run.stdout:
        parts.append(run.stdout.rstrip("\n"))
    if run.stderr:
        parts.append("[stderr]\n" + run.stderr.rstrip("\n"))
    if run.timed_out:
        parts.append(f"[killed: time limit of {limits.timeout_s:g} s exceeded]")
    elif run.memory_exceeded:
        parts.append(f"[failed: memory limit of {limits.memory_mb} MiB exceeded]")
    elif run.exit_code:
        parts.append(f"[exit code {run.exit_code}]")
    if run.truncated:
        parts.append(f"[output cut to {limits.max_output_chars} characters per stream]")
    return "\n".join(parts) if parts else "[no output]"


class PythonSandboxTool(Tool):
    """A tool that runs Python code in the subprocess sandbox, in the attempt's workspace.

    >>> tool = PythonSandboxTool(limits=SandboxLimits(timeout_s=2, memory_mb=256))
    >>> tool.schema.name
    'run_python'
    """

    nondeterministic = True  # timing and memory outcomes depend on the host: a replay feeds results from the log

    def __init__(self, *, name: str = "run_python", limits: SandboxLimits | None = None,
                 workspace: str | Path | None = None, python: str = sys.executable) -> None:
        self.limits = limits or SandboxLimits()
        self.python = python
        self._fixed = Path(workspace) if workspace is not None else None
        self._own: Path | None = None
        self.schema = ToolSchema(
            name=name,
            description=(f"Run a Python 3 program and return its stdout and stderr. Each call is a fresh process "
                         f"in the task's working directory (files persist between calls of one attempt); no "
                         f"network; limits: {self.limits.timeout_s:g} s, {self.limits.memory_mb} MiB. Print what "
                         f"you need to see."),
            input_schema={
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The Python program to run."},
                    "timeout_s": {"type": "number", "description": "Optional shorter time limit in seconds."},
                },
                "required": ["code"],
            },
        )

    def workspace(self) -> Path:
        """The directory code runs in: given, the attempt's, or a private one made on first use."""
        if self._fixed is not None:
            return self._fixed
        current = current_workspace()
        if current is not None:
            return current
        if self._own is None:
            self._own = Path(tempfile.mkdtemp(prefix="hx-sandbox-"))
            weakref.finalize(self, shutil.rmtree, self._own, True)
        return self._own

    def close(self) -> None:
        """Remove the private workspace, if this tool made one."""
        if self._own is not None:
            shutil.rmtree(self._own, ignore_errors=True)
            self._own = None

    def _limits_for(self, call: ToolCall) -> SandboxLimits:
        asked: Any = call.input.get("timeout_s")
        if isinstance(asked, int | float) and not isinstance(asked, bool) and 0 < asked < self.limits.timeout_s:
            return msgspec.structs.replace(self.limits, timeout_s=float(asked))
        return self.limits

    async def call(self, call: ToolCall) -> ToolResult:
        """Run the call's ``code``; a failure of the code is an error result, never an exception."""
        code = call.input.get("code")
        if not isinstance(code, str):
            return ToolResult(call_id=call.id, name=call.name, is_error=True,
                              output="run_python needs a string argument 'code'")
        limits = self._limits_for(call)
        try:
            run = await run_python(code, self.workspace(), limits, python=self.python)
        except (OSError, RuntimeError) as exc:
            return ToolResult(call_id=call.id, name=call.name, is_error=True,
                              output=f"the sandbox could not start: {exc}")
        return ToolResult(call_id=call.id, name=call.name, output=render(run, limits),
                          is_error=run.timed_out or run.exit_code != 0,
                          data={"exit_code": run.exit_code, "timed_out": run.timed_out,
                                "memory_exceeded": run.memory_exceeded, "truncated": run.truncated,
                                "network": run.network})
