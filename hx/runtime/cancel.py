"""Ending asyncio tasks for good: a group when one of them fails, a command's task when it is stopped.

``cancel_all`` is what the run loop's callers (a rollout's attempt workers, a replay's
reader and workers) do after the first failure: cancel the rest and wait for them. A plain
``cancel`` then ``gather`` is not enough on Python 3.11: ``asyncio.wait_for``, which nats-py
wraps around every request and fetch, returns its result and drops a cancellation that
arrives as the awaited future completes. The task then runs on, and a worker that goes back
to a queue its producer will never fill again waits forever, and so does the ``gather``.

``stop_if_cancelled`` is the same remedy for a long-lived task nobody waits on to re-cancel
(``hx evolve``'s own, stopped by Ctrl-C or SIGTERM): a dropped cancellation still counts in
``Task.cancelling()``, so a task that checks before each new step stops at the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

RECANCEL_S = 0.5
"""How long a cancelled task may run on before it is cancelled again (at its next await)."""


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again any that goes on."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for t in tasks:  # their failures are the caller's first failure's consequences: retrieve them, quietly
        if not t.cancelled():
            with contextlib.suppress(BaseException):
                t.exception()


def stop_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task was asked to stop and runs on (a cancellation 3.11 dropped).

    Call it before a new step of work (a round, a ledger append), never while cleaning up after
    a cancellation: then the request is being honoured already.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("a cancellation was dropped on the way (Python 3.11 wait_for); stopping now")
