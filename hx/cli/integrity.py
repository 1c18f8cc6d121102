"""``hx log verify`` and ``hx log accept-loss``: is every stream whole, and the one way to go on when it is not.

Every hx command refuses a stream that lost events (``streams.integrity``). ``verify``
says why, stream by stream, without refusing: settings that could lose events, events lost
since hx last saw the stream, stored messages the server will not serve (a damaged block
file), and, on ``HX_LEDGER``, every run's ledger checked on its own (``hx.replay.audit``: the
fold, chain, signatures, folds and decisions). ``accept-loss`` records on the ledger that
someone accepted the loss, with their reason, and moves the stream's head so that hx uses
the stream again. Settings that could lose events are never accepted: change them back.
"""

from __future__ import annotations

import click
from rich.table import Table

from hx.cli._app import App, pass_app, run, stdout_console
from hx.replay.audit import verify_ledger
from projections.ledger_reader import EditLedger
from projections.runner import ProjectionRunner
from schemas.errors import HxError
from schemas.integrity import StreamLossAccepted
from streams.connection import connect
from streams.integrity import Heads, local_heads, missing_events, problems, unreadable
from streams.log import EventLog
from streams.topology import LEDGER, SPECS, apply_topology, stream_infos

INTEGRITY_SUBJECT = "hx.ledger.integrity"
"""Where accepted losses go on the ledger."""


async def _findings(heads: Heads, *, read: bool = False) -> dict[str, list[str]]:
    """Per stream, every problem: settings that could lose events, events lost since hx last saw it, and (with
    ``read``) stored messages the server will not serve."""
    infos = await stream_infos(heads.js, SPECS)
    server = await heads.server_heads(SPECS)
    local = heads.mirror.load() if heads.mirror is not None else {}
    out: dict[str, list[str]] = {}
    for name, info in infos.items():
        found = [f"setting {d}" for d in SPECS[name].differences(info.config)] if info is not None else []
        for head, where in ((server.get(name, (None, 0))[0], "the server's head"), (local.get(name), "the local head")):
            found += [p for p in problems(name, info, head, where) if p not in found]
        if read and info is not None:
            damaged, seqs = await unreadable(heads.js, info)
            if damaged:
                which = f" (message{'s' if len(seqs) > 1 else ''} {', '.join(map(str, seqs[:8]))}" + (
                    ", ..." if len(seqs) > 8 else "") + ")" if seqs else ""
                found.append(f"stream {name}: {damaged:,} stored message(s) cannot be read{which}: their copy on "
                             "disk is damaged (the server's checksum fails)")
        out[name] = found
    return out


async def _ledgers(log: EventLog) -> dict[str, list[str]]:
    """Every run's ledger on ``HX_LEDGER``, checked on its own: run -> its problems (none when it verifies)."""
    runs = ProjectionRunner(log, EditLedger())
    await runs.catch_up(checkpoint=False)
    out: dict[str, list[str]] = {}
    for run_id, ledger in runs.state.items():
        result = await verify_ledger(log, ledger, trace=False)
        out[run_id or "(no run)"] = [str(p) for p in result.problems]
    return out


@click.command("verify")
@pass_app
def verify(app: App) -> None:
    """Check every stream: settings that could lose events, and events lost since hx last saw it."""
    findings, ledgers = run(_verify(app))
    table = Table(title="stream integrity", header_style="bold")
    table.add_column("stream")
    table.add_column("state")
    for name, found in findings.items():
        table.add_row(name, "\n".join(found) if found else "whole")
    stdout_console().print(table)
    if ledgers:  # plain lines, one a problem: they name events, and a table would wrap them
        click.echo(f"run ledgers on {LEDGER.name}:")
    for run_id, found in ledgers.items():
        click.echo(f"  {run_id}: " + ("verifies" if not found else f"{len(found)} problem(s)"))
        for problem in found[:5]:
            click.echo(f"    {problem}")
        if len(found) > 5:
            click.echo(f"    ... {len(found) - 5} more: hx audit verify {run_id}")
    broken = [name for name, found in findings.items() if found] + [r for r, found in ledgers.items() if found]
    if broken:
        raise HxError(f"{', '.join(broken)} cannot be used as they are; see above")


async def _verify(app: App) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    async with connect(app.settings, apply=False) as conn:
        return await _findings(Heads(conn.js, local_heads(app.settings)), read=True), await _ledgers(conn.log)


@click.command("accept-loss")
@click.argument("stream", type=click.Choice(sorted(SPECS)))
@click.option("--reason", required=True, help="Why the loss is accepted (recorded on the ledger).")
@pass_app
def accept_loss(app: App, stream: str, reason: str) -> None:
    """Accept that STREAM lost events: record it on the ledger and use the stream again."""
    event = run(_accept(app, stream, reason))
    click.echo(f"accepted: {stream} ({event.accepted_missing:,} missing events) — recorded on {LEDGER.name}")


async def _accept(app: App, stream: str, reason: str) -> StreamLossAccepted:
    async with connect(app.settings, apply=False) as conn:
        heads = Heads(conn.js, local_heads(app.settings))
        found = (await _findings(heads))[stream]
        settings = [f for f in found if f.startswith("setting ")]
        if settings:
            raise HxError(f"{stream} has settings that could lose more events ({'; '.join(settings)}); change "
                          "them back first: a loss can be accepted, a risk cannot")
        if not found:
            raise HxError(f"{stream} lost nothing; there is no loss to accept")
        info = (await stream_infos(conn.js, [stream]))[stream]
        if info is None:
            await heads.forget(stream)
        else:
            await heads.record([info], replace=True)
        await apply_topology(conn.js, heads)  # recreates a stream that was gone, checks all the others
        after = (await stream_infos(conn.js, [stream]))[stream]
        assert after is not None
        event = StreamLossAccepted(stream=stream, problems=tuple(found), reason=reason,
                                   last_seq=int(after.state.last_seq or 0), messages=int(after.state.messages or 0),
                                   accepted_missing=missing_events(after))
        conn.log.heads = heads  # the append moves the ledger's head too
        await conn.log.append(INTEGRITY_SUBJECT, event)
        return event
