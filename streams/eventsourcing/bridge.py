"""A private asyncio event loop on its own thread, so synchronous code can drive nats-py.

The ``eventsourcing`` library is synchronous and threaded while nats-py is asyncio. Each
JetStream datastore owns exactly one ``LoopThread``: every caller thread hands coroutines
to it with ``run_coroutine_threadsafe`` and waits on the result with a timeout. Nested or
per-call event loops are never created, so one NATS connection serves all threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CLOSE_TIMEOUT = 5.0


class LoopClosedError(RuntimeError):
    """The loop thread was closed, so the coroutine was not (or not fully) run."""


class LoopThread:
    """One asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str = "hx-es-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._lock = threading.Lock()
        # Daemon: a forgotten close() must not keep the interpreter alive at exit.
        self._thread = threading.Thread(target=self._run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that runs on the thread."""
        return self._loop

    @property
    def closed(self) -> bool:
        """True once ``close`` has begun."""
        return self._closed

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where ``run`` would deadlock)."""
        return threading.get_ident() == self._thread.ident

    def _run_forever(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` on the loop and block until it finishes or ``timeout`` passes.

        Raises ``TimeoutError`` (after cancelling the coroutine) when time runs out and
        ``LoopClosedError`` when the loop is closed before or while the coroutine runs.
        """
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop thread: it would deadlock")
        with self._lock:
            if self._closed:
                coro.close()
                raise LoopClosedError("the NATS connection is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout}s") from None
        except concurrent.futures.CancelledError:
            raise LoopClosedError("the NATS connection was closed during the call") from None

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Cancel what is still running on the loop, stop it and join the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.in_loop_thread():
            # Called from a callback on the loop itself: we cannot wait for ourselves.
            self._loop.call_soon(self._loop.stop)
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()


async def _cancel_other_tasks() -> None:
    """Cancel every task on the running loop except this one, and wait for them to finish."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
