"""``cancel_all`` ends every task of a group, one that drops its first cancellation too (as 3.11's wait_for may)."""

from __future__ import annotations

import asyncio

import pytest

from hx.runtime.cancel import cancel_all


def stubborn(queue: asyncio.Queue[int], started: asyncio.Event, dropped: asyncio.Event) -> asyncio.Task[None]:
    """A worker whose first cancellation is dropped, as nats-py's ``wait_for`` can drop it, and that then goes back to
    a queue nobody fills any more."""

    async def work() -> None:
        try:
            started.set()
            await asyncio.Event().wait()  # a request whose answer arrives with the cancellation
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            dropped.set()
        await queue.get()

    return asyncio.create_task(work())


async def test_a_plain_cancel_leaves_a_worker_that_dropped_it_waiting() -> None:
    """The failure cancel_all is for: one cancel, and the worker waits on its queue for good."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    started, dropped = asyncio.Event(), asyncio.Event()
    task = stubborn(queue, started, dropped)
    await started.wait()
    task.cancel()
    await dropped.wait()  # by now it waits on the queue again
    assert not task.done()
    await cancel_all([task])
    assert task.cancelled()


async def test_cancel_all_ends_every_task_after_the_first_failure() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    started, dropped = asyncio.Event(), asyncio.Event()

    async def failing() -> None:
        await started.wait()
        raise ValueError("the reader failed")

    async def idle() -> None:
        await queue.get()

    tasks = [stubborn(queue, started, dropped), asyncio.create_task(failing()), asyncio.create_task(idle())]
    with pytest.raises(ValueError, match="the reader failed"):
        await asyncio.gather(*tasks)
    await cancel_all(tasks)
    assert dropped.is_set() and all(t.done() for t in tasks)
    assert tasks[0].cancelled() and tasks[2].cancelled()
    assert isinstance(tasks[1].exception(), ValueError)
    await cancel_all(tasks)  # nothing left to do: returns at once
