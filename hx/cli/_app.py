"""Glue shared by the command groups: the root context object, running coroutines, output helpers."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click
import structlog
from rich.console import Console

from schemas.envelope import Record
from schemas.errors import HxError
from schemas.event import event_types
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.log import EventLog
from streams.private import private_dir
from streams.topology import check_run_id

if TYPE_CHECKING:
    from projections.base import Projection

T = TypeVar("T")
EXIT_TERMINATED = 143
log = structlog.get_logger("hx.cli")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class App:
    """What the root command settles for every subcommand: where the log is and how to report."""

    settings: NatsSettings
    debug: bool = False
    json_logs: bool = False

    def connect(self, *, auditor: bool = False) -> AbstractAsyncContextManager[Connection]:
        """Open the log: the configured NATS URL, or the embedded server under the data dir.

        With ``auditor`` as the read-only auditor (``hx audit``, ``hx ledger``): nothing can be written.
        """
        return connect(self.settings, auditor=auditor)

    def private_data_dir(self) -> Path:
        """The data directory, made with mode 0700 if missing (whatever the umask), else checked."""
        return private_dir(self.settings.data_dir, what="data directory")


pass_app = click.make_pass_decorator(App)


class Terminated(BaseException):
    """The process got SIGTERM (a BaseException, like KeyboardInterrupt, so no broad handler eats it)."""


async def _terminable(coro: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    requested = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if requested:
            # A second SIGTERM stops now, cleanup skipped: a cancellation that Python 3.11's
            # wait_for swallowed (inside nats-py) can leave a task that no cancel ends.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_TERMINATED)
        requested = True
        # The first cancels like Ctrl-C: followers checkpoint and the embedded server is released.
        loop.call_soon_threadsafe(task.cancel, "SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return await coro
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on a fresh event loop; Ctrl-C raises KeyboardInterrupt, SIGTERM ``Terminated``."""
    try:
        return asyncio.run(_terminable(coro))
    except asyncio.CancelledError:
        raise Terminated from None


def stdout_console() -> Console:
    """A rich console on the current stdout (tables, summaries)."""
    return Console(highlight=False)


def stderr_console() -> Console:
    """A rich console on the current stderr (progress bars, notes)."""
    return Console(stderr=True, highlight=False)


def iso_time(time_ns: int) -> str | None:
    """An ``Hx-Time`` header (ns since the epoch) as ISO 8601 UTC with microseconds; None when absent."""
    if time_ns <= 0:
        return None
    return (_EPOCH + timedelta(microseconds=time_ns // 1000)).isoformat(timespec="microseconds")


def named_projection(name: str) -> Projection[Any]:
    """A fresh instance of a registered projection, or an ``HxError`` listing the known ones."""
    from projections.registry import projection  # the registry (and its plugin loader) only for the commands using it

    try:
        return projection(name)
    except KeyError as exc:
        raise HxError(str(exc.args[0])) from None


def check_event_types(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Click callback: every ``--type`` must name a registered event type."""
    known = event_types()
    unknown = [t for t in value if t not in known]
    if unknown:
        raise click.BadParameter(f"unknown event type(s) {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(known)}", ctx=ctx, param=param)
    return value


def quarantine_note(event_log: EventLog) -> None:
    """Tell stderr how many undecodable messages a command skipped, if any."""
    if event_log.quarantine.count:
        click.echo(f"warning: {event_log.quarantine.count} undecodable message(s) skipped (quarantined); "
                   "each was logged with its reason", err=True)


async def follow_records(event_log: EventLog, stream: str, *, start: int, subjects: Sequence[str],
                         types: Sequence[str]) -> AsyncIterator[Record]:
    """Records from ``start`` on, then live ones, until cancelled; survives an idle subscription's timeout."""
    next_seq = start
    while True:
        try:
            async for record in event_log.subscribe(stream, start=next_seq, subjects=subjects, types=types):
                next_seq = record.seq + 1  # a fetch fails between messages, never inside a frame
                yield record
        except TimeoutError:
            # An idle fetch's timeout is handled inside EventLog.subscribe; one creating or inspecting
            # the consumer (a busy or restarting server) still gets out: subscribe again from here.
            log.debug("subscription timed out while idle; resubscribing", stream=stream, start=next_seq)


def check_round_or_stage(round_: int | None, stage: int | None, *, required: bool) -> None:
    """``--round`` and ``--stage`` exclude each other (and one is needed when ``required``)."""
    if round_ is not None and stage is not None:
        raise click.UsageError("--round (a trace round) and --stage (an evolution round) exclude each other")
    if required and round_ is None and stage is None:
        raise click.UsageError("pass --round N (a trace round) or --stage N (an evolution round's main rollouts)")


def run_id_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: a run id must be valid (``streams.topology.check_run_id``) before anything runs."""
    if value is not None:
        try:
            check_run_id(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value
