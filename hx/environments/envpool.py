"""Pooled JVM environments and the text-game task built on them (TextWorldExpress, ScienceWorld).

A JVM-backed environment takes 0.3-3 s and ~300 MB to start, so each worker process keeps one
pool per benchmark: a task checks an environment out at ``reset`` and returns it at ``close``;
the next task loads its own game into it, so nothing but the JVM is shared. The py4j calls
block, so a task runs them in a thread (``asyncio.to_thread``): concurrent attempts overlap, each
on its own JVM. When a JVM dies (a ``Py4JNetworkError``) the environment is thrown away, the
attempt raises ``EnvironmentCrashed`` (the run loop records an infrastructure failure) and the
next task starts a new JVM.

The agent acts through one tool, ``act``, whose input is an enum of the actions valid now; the
schema changes every step (``ActTool.schema`` always shows the current list), and the list is
repeated in the tool result's text and in ``data["valid_actions"]``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import subprocess
import threading
import weakref
from abc import abstractmethod
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Generic, TypeVar

from py4j.protocol import Py4JError, Py4JJavaError

from hx.environments.errors import BenchmarkError, EnvironmentCrashed
from hx.runtime.task import Task, Tool
from schemas.event import Event
from schemas.messages import ToolCall, ToolResult, ToolSchema
from schemas.tools import EnvObservation

E = TypeVar("E")
R = TypeVar("R")


def java_process(env: Any) -> subprocess.Popen[bytes]:
    """The JVM process behind a TextWorldExpress or ScienceWorld environment."""
    proc: subprocess.Popen[bytes] = env._gateway.java_process
    return proc


def shutdown(env: Any, *, kill: bool = False) -> None:
    """Stop an environment's JVM, whatever state it is in (``kill``: at once, it may hang); never raises."""
    gateway = env._gateway
    proc = java_process(env)
    if kill and proc.poll() is None:
        proc.kill()
        proc.wait()
    with contextlib.suppress(Py4JError, OSError):
        gateway.shutdown()
    # py4j frees Java objects from Python finalizers, which would now try to reach a gone JVM and log
    # a formatted traceback from inside whatever code the garbage collector interrupted.
    client = gateway._gateway_client
    client.is_connected = False
    client.close()
    if proc.poll() is None and proc.stdin is not None:
        with contextlib.suppress(OSError):  # the JVM exits when its stdin closes (py4j die_on_exit)
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # The libraries' __del__ calls close() again, which writes to the dead JVM's stdin
    # (BrokenPipeError at interpreter exit): make that second close a no-op.
    env.close = _noop


def _noop() -> None:
    return None


class EnvPool(Generic[E]):
    """A thread-safe pool of started environments; grows to the number used at once."""

    def __init__(self, name: str, start: Callable[[], E]) -> None:
        self.name = name
        self._start = start
        self._lock = threading.Lock()
        self._idle: list[E] = []
        self._busy: dict[int, tuple[E, int]] = {}
        self._generation = 0
        self.started = 0
        """JVMs started over the pool's life."""
        self.discarded = 0
        """JVMs thrown away after a failure."""
        _POOLS.add(self)

    def acquire(self) -> E:
        """An idle environment, or a newly started one (blocks while a JVM starts)."""
        with self._lock:
            env = self._idle.pop() if self._idle else None
        if env is None:
            try:
                env = self._start()
            except (Py4JError, OSError) as exc:
                raise EnvironmentCrashed(f"{self.name}: the JVM did not start: {exc}") from exc
            with self._lock:
                self.started += 1
        with self._lock:
            self._busy[id(env)] = (env, self._generation)
        return env

    def release(self, env: E) -> None:
        """Give a healthy environment back (it is stopped instead if the pool was closed meanwhile)."""
        with self._lock:
            _, generation = self._busy.pop(id(env), (env, -1))
            keep = generation == self._generation
            if keep:
                self._idle.append(env)
        if not keep:
            shutdown(env)

    def discard(self, env: E) -> None:
        """Stop an environment that failed; the next ``acquire`` starts a new JVM."""
        with self._lock:
            self._busy.pop(id(env), None)
            self.discarded += 1
        shutdown(env, kill=True)

    @property
    def idle(self) -> int:
        """Started environments waiting for a task."""
        with self._lock:
            return len(self._idle)

    @property
    def in_use(self) -> int:
        """Environments checked out by running tasks."""
        with self._lock:
            return len(self._busy)

    def stop_busy(self) -> None:
        """Stop the JVMs checked out and not given back (only safe once no thread can be using them)."""
        with self._lock:
            busy, self._busy = [env for env, _ in self._busy.values()], {}
        for env in busy:
            shutdown(env, kill=True)

    def close(self) -> None:
        """Stop the idle JVMs now and the busy ones when their tasks give them back; the pool stays usable."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for env in idle:
            shutdown(env)


_POOLS: weakref.WeakSet[EnvPool[Any]] = weakref.WeakSet()
_SHARED: dict[str, EnvPool[Any]] = {}
_SHARED_LOCK = threading.Lock()


def own_process_group(library: ModuleType) -> None:
    """Make ``library`` (a module that calls py4j's ``launch_gateway``) start each JVM in its own process group.

    A terminal's Ctrl-C signals the whole foreground process group: a game JVM in it dies at
    once, failing the py4j call in flight, and every attempt then ends as a crashed
    environment with a traceback. In a group of its own the JVM waits for hx, which stops
    its JVMs itself as the run is cancelled. TextWorldExpress and ScienceWorld call
    ``launch_gateway`` without py4j's ``create_new_process_group`` option, so it is added here.
    """
    launch = library.launch_gateway
    if getattr(launch, "_own_group", False):
        return

    @functools.wraps(launch)
    def launch_in_own_group(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("create_new_process_group", True)
        return launch(*args, **kwargs)

    launch_in_own_group._own_group = True  # type: ignore[attr-defined]
    library.launch_gateway = launch_in_own_group  # type: ignore[attr-defined]


def shared_pool(name: str, start: Callable[[], E]) -> EnvPool[E]:
    """The worker's pool for ``name``, made on first use (every benchmark instance shares it)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(name)
        if pool is None:
            pool = _SHARED[name] = EnvPool(name, start)
        return pool


@atexit.register
def _close_all() -> None:
    """At exit no thread uses an environment any more: stop every JVM, the ones never given back too.

    (An attempt cancelled while its JVM started, by Ctrl-C say, never gives it back; the
    JVM runs in a process group of its own, so nothing else would stop it now.)
    """
    for pool in list(_POOLS):
        pool.close()
        pool.stop_busy()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a finished call's exception as seen: the attempt that awaited it handles it, or was cancelled."""
    if not future.cancelled():
        future.exception()


def act_schema(actions: Sequence[str], description: str) -> ToolSchema:
    """The ``act`` tool's schema with ``actions`` as the enumerated input."""
    action: dict[str, Any] = {"type": "string", "description": "one of the actions valid now, verbatim"}
    if actions:
        action["enum"] = list(actions)
    return ToolSchema(name="act", description=description,
                      input_schema={"type": "object", "properties": {"action": action}, "required": ["action"]})


class ActTool(Tool):
    """The ``act`` tool of a text-game task: one action per call, chosen from the valid ones."""

    def __init__(self, task: TextGameTask[Any]) -> None:
        self._task = task

    @property
    def schema(self) -> ToolSchema:
        """The schema with the actions valid at this moment."""
        return act_schema(self._task.valid_actions, self._task.act_description)

    @schema.setter
    def schema(self, value: ToolSchema) -> None:
        raise AttributeError("the act tool's schema follows the game; it cannot be set")

    async def call(self, call: ToolCall) -> ToolResult:
        """Take the action in the environment; raises ``EnvironmentCrashed`` when the JVM is gone."""
        action = call.input.get("action")
        if not isinstance(action, str) or not action.strip():
            return ToolResult(call_id=call.id, name=call.name, is_error=True,
                              output="act needs an 'action': one of the valid actions, as a string")
        if self._task.done:
            return ToolResult(call_id=call.id, name=call.name, is_error=True, output="the episode is over")
        output, data = await self._task.act(action.strip())
        return ToolResult(call_id=call.id, name=call.name, output=output, data=data)


class TextGameTask(Task, Generic[E]):
    """One episode of a pooled JVM text game; subclasses say how to start, step and judge it."""

    act_description = "Take one action in the game."

    def __init__(self, pool: EnvPool[E]) -> None:
        self._pool = pool
        self._env: E | None = None
        self._inflight = False
        self._pending: asyncio.Future[Any] | None = None
        self._events: list[Event] = []
        self._tools: tuple[Tool, ...] = (ActTool(self),)
        self.valid_actions: tuple[str, ...] = ()
        """The actions offered now (the ``act`` enum)."""
        self.moves = 0
        """Actions taken in this episode."""
        self.score = 0.0
        self.success = False
        self.failure = False
        self._done = False

    # --- what a game adapter provides -----------------------------------------------------

    @abstractmethod
    def _start(self, env: E) -> tuple[str, dict[str, Any]]:
        """Load and reset the episode in ``env`` (in a worker thread); the first message and its state."""

    @abstractmethod
    def _step(self, env: E, action: str) -> tuple[str, dict[str, Any]]:
        """Take one action (in a worker thread); the observation and the new state."""

    # --- the Task port --------------------------------------------------------------------

    def tools(self) -> Sequence[Tool]:
        """The ``act`` tool."""
        return self._tools

    def tool_schemas(self) -> tuple[ToolSchema, ...]:
        """The tools' schemas as they are now (the ``act`` enum follows the game)."""
        return tuple(tool.schema for tool in self._tools)

    @property
    def done(self) -> bool:
        """True once the game ended (success, failure or its own step limit)."""
        return self._done

    @property
    def jvm_pid(self) -> int | None:
        """The process id of the JVM this task holds (None before ``reset`` and after ``close``)."""
        return None if self._env is None else java_process(self._env).pid

    def drain_events(self) -> list[Event]:
        """The environment observations since the last call."""
        events, self._events = self._events, []
        return events

    async def reset(self) -> str:
        """Check a JVM out of the pool and start the episode; the first user message."""
        if self._env is not None:
            raise BenchmarkError(f"{self.spec.id}: reset twice; make a new task for each attempt")
        self._env = await asyncio.to_thread(self._pool.acquire)
        message, state = await self._call(self._start, self._env)
        # The opening observation carries the task's instruction, so that a reader of observations alone (the
        # rule induction) knows the task text a rule's ``TaskText`` reads.
        state["info"] = {**state.get("info", {}), "task": self.spec.instruction}
        self._observe(state, "")
        return message

    async def act(self, action: str) -> tuple[str, dict[str, Any]]:
        """Take ``action``: the tool's text (observation and valid actions) and its structured data."""
        if self._env is None:
            raise BenchmarkError(f"{self.spec.id}: act before reset")
        offered = action in self.valid_actions
        observation, state = await self._call(self._step, self._env, action)
        self.moves += 1
        event = self._observe(state, action, invalid=not offered)
        return self._render(observation), {
            "valid_actions": list(self.valid_actions), "invalid": not offered, "score": event.score,
            "done": event.done, "success": event.success, "failure": event.failure}

    async def close(self) -> None:
        """Give the JVM back to the pool (or stop it if a call is still running in its thread)."""
        env, self._env = self._env, None
        if env is None:
            return
        if self._inflight:  # cancelled mid-call (a timeout): the thread still uses the JVM
            await asyncio.to_thread(self._pool.discard, env)
            if self._pending is not None:  # the stopped JVM fails the call: let its thread finish
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._pending, timeout=10)
        else:  # in a thread too: after Benchmark.close() releasing means stopping the JVM
            await asyncio.to_thread(self._pool.release, env)

    # --- helpers --------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., R], env: E, *args: Any) -> R:
        self._inflight = True  # stays set if the await is cancelled: the thread still holds the JVM
        pending: asyncio.Future[R] = asyncio.ensure_future(asyncio.to_thread(fn, env, *args))
        pending.add_done_callback(_retrieved)  # a run torn down mid-call may never await it again
        self._pending = pending
        try:
            result = await asyncio.shield(pending)  # a cancelled attempt leaves the call for close()
        except Py4JJavaError as exc:  # the game refused (bad options): the JVM itself is fine
            self._inflight = False
            raise BenchmarkError(f"{self.spec.id}: {exc.java_exception}") from None
        except Py4JError as exc:
            self._inflight = False
            self._env = None
            pid = java_process(env).pid
            await asyncio.to_thread(self._pool.discard, env)
            raise EnvironmentCrashed(f"{self.spec.id}: the {self._pool.name} JVM (pid {pid}) failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        except Exception:
            self._inflight = False
            raise
        self._inflight = False
        return result

    def _observe(self, state: dict[str, Any], action: str, *, invalid: bool = False) -> EnvObservation:
        self.valid_actions = tuple(state["valid_actions"])
        self.score = float(state["score"])
        self.success, self.failure, self._done = bool(state["success"]), bool(state["failure"]), bool(state["done"])
        info: dict[str, Any] = {"action": action, "invalid": invalid, "moves": self.moves, **state.get("info", {})}
        event = EnvObservation(step=self.moves, observation=state["observation"], valid_actions=self.valid_actions,
                               score=self.score, done=self._done, success=self.success, failure=self.failure,
                               info=info)
        self._events.append(event)
        return event

    def _render(self, observation: str) -> str:
        if self._done:
            verdict = "success" if self.success else "failure" if self.failure else "the game's step limit"
            return f"{observation}\n\nThe episode is over ({verdict}); score {self.score:g}."
        return f"{observation}\n\nValid actions: {', '.join(self.valid_actions)}"
