"""``hx log``: read the event log as typed events (``dump``, ``tail``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, TypeVar

import click
import msgspec

from hx.cli._app import App, check_event_types, follow_records, iso_time, pass_app, quarantine_note, run
from hx.cli.integrity import accept_loss, verify
from schemas.envelope import Record
from schemas.event import Event
from schemas.history import HistoryResolver
from streams.log import EventLog
from streams.topology import SPECS, TRACE

F = TypeVar("F", bound=Callable[..., Any])
_json = msgspec.json.Encoder()
_FLUSH_EVERY = 1000
_VALUE_WIDTH = 60
_LINE_WIDTH = 240


class DumpLine(msgspec.Struct, frozen=True, omit_defaults=True):
    """One event as ``hx log dump`` writes it: its place on the log, when it happened and its typed body."""

    seq: int
    index: int
    subject: str
    type: str
    version: int
    time: str | None
    """When the event happened (ISO 8601, UTC)."""
    event: Any
    took_ms: float | None = None
    """How long the model or tool call the event ends took (left out when it ends none)."""


def json_line(record: Record) -> bytes:
    """A record as one JSON line (the encoder walks the event Struct itself, no dict in between)."""
    line = DumpLine(record.seq, record.index, record.subject, record.type, record.version,
                    iso_time(record.time_ns), record.event, record.took_ns / 1e6 if record.took_ns else None)
    return _json.encode(line) + b"\n"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else _json.encode(msgspec.to_builtins(value)).decode()
    text = " ".join(text.split())
    if isinstance(value, str):
        text = repr(text if len(text) <= _VALUE_WIDTH else text[:_VALUE_WIDTH] + "…")
    elif len(text) > _VALUE_WIDTH:
        text = text[:_VALUE_WIDTH] + "…"
    return text


def compact(event: Event | msgspec.Struct) -> str:
    """An event as ``field=value`` pairs on one line, fields left at their default omitted."""
    parts = []
    for field in msgspec.structs.fields(event):
        value = getattr(event, field.name)
        if field.default is not msgspec.NODEFAULT and value == field.default:
            continue
        if field.default_factory is not msgspec.NODEFAULT and value == field.default_factory():
            continue
        if isinstance(value, msgspec.Struct) and type(value).__struct_config__.tag is not None:
            parts.append(f"{field.name}={type(value).__struct_config__.tag}({compact(value)})")
        else:
            parts.append(f"{field.name}={_short(value)}")
    return " ".join(parts)


def human_line(record: Record) -> str:
    """A record as ``seq:index subject type body``, cut to one terminal-friendly line."""
    line = f"{record.seq}:{record.index} {record.subject} {record.type} {compact(record.event)}"
    return line if len(line) <= _LINE_WIDTH else line[: _LINE_WIDTH - 1] + "…"


def filter_options(fn: F) -> F:
    """The stream, subject and type filters ``dump`` and ``tail`` share."""
    fn = click.option("--type", "types", multiple=True, callback=check_event_types, metavar="TYPE",
                      help="Only events of this type (repeatable).")(fn)
    fn = click.option("--subject", "subjects", multiple=True, metavar="FILTER",
                      help="Only subjects matching this NATS filter (repeatable), e.g. 'hx.trace.RUN.>'.")(fn)
    fn = click.option("--stream", default=TRACE.name, show_default=True, type=click.Choice(sorted(SPECS)),
                      help="The stream to read.")(fn)
    return fn


@click.group("log")
def log_group() -> None:
    """Read the event log."""


log_group.add_command(verify)
log_group.add_command(accept_loss)


@log_group.command("dump")
@filter_options
@click.option("--from", "start", type=click.IntRange(min=1), default=1, metavar="SEQ",
              help="First stream sequence.  [default: 1]")
@click.option("--to", "stop", type=click.IntRange(min=1), metavar="SEQ",
              help="Last stream sequence.  [default: the end now]")
@click.option("--as-stored", is_flag=True,
              help="Write conversations as the log stores them (deltas), not in full.")
@pass_app
def dump(app: App, stream: str, subjects: tuple[str, ...], types: tuple[str, ...], start: int,
         stop: int | None, as_stored: bool) -> None:
    """Write typed events as JSON lines.

    One object per event: seq, index (in its frame), subject, type, version, time (ISO UTC), event.
    Conversations, which the log stores as deltas, are written in full wherever the dump has
    read the attempt's earlier ones (from its start); elsewhere as stored.
    """
    run(_dump(app, stream, subjects, types, start, stop, sys.stdout.buffer, resolve=not as_stored))


async def _dump(app: App, stream: str, subjects: Sequence[str], types: Sequence[str], start: int,
                stop: int | None, out: BinaryIO, *, resolve: bool = True) -> None:
    resolver = HistoryResolver(strict=False) if resolve else None
    wanted = frozenset(types)
    async with app.connect() as conn:
        chunk: list[bytes] = []
        # A conversation is a delta against its attempt's previous one, whatever that event's type: resolving
        # reads every type and filters here.
        read_types = () if resolver is not None else types
        async for record in conn.log.read(stream, start=start, stop=stop, subjects=subjects, types=read_types):
            if resolver is not None:
                record = resolver.resolve(record)
                if wanted and record.type not in wanted:
                    continue
            chunk.append(json_line(record))
            if len(chunk) >= _FLUSH_EVERY:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
        out.flush()
        quarantine_note(conn.log)


@log_group.command("tail")
@filter_options
@click.option("-n", "--lines", "count", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many of the last events to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, as `hx log dump` writes them.")
@pass_app
def tail(app: App, stream: str, subjects: tuple[str, ...], types: tuple[str, ...], count: int, follow: bool,
         as_json: bool) -> None:
    """Show the last events, and with --follow new ones as they arrive."""
    run(_tail(app, stream, subjects, types, count, follow, as_json))


async def last_records(log: EventLog, stream: str, count: int, subjects: Sequence[str],
                       types: Sequence[str]) -> tuple[list[Record], int]:
    """The last ``count`` matching records and the stream's end sequence, reading backwards in widening windows."""
    end = await log.last_seq(stream)
    found: list[Record] = []
    hi, window = end, max(count, 64)
    while count and hi >= 1 and len(found) < count:
        lo = max(1, hi - window + 1)
        chunk = [r async for r in log.read(stream, start=lo, stop=hi, subjects=subjects, types=types)]
        found = (chunk + found)[-count:]
        hi, window = lo - 1, window * 4
    return found, end


async def _tail(app: App, stream: str, subjects: Sequence[str], types: Sequence[str], count: int,
                follow: bool, as_json: bool) -> None:
    out = sys.stdout.buffer

    def emit(record: Record) -> None:
        out.write(json_line(record) if as_json else (human_line(record) + "\n").encode())

    async with app.connect() as conn:
        records, end = await last_records(conn.log, stream, count, subjects, types)
        for record in records:
            emit(record)
        out.flush()
        if follow:
            async for record in follow_records(conn.log, stream, start=end + 1, subjects=subjects, types=types):
                emit(record)
                out.flush()
        quarantine_note(conn.log)
