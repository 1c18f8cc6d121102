"""``hx ledger``, ``hx audit verify`` and ``hx audit head``: an evolution run's edit ledger read by an auditor, checked.

``hx ledger RUN`` lists every candidate, critic verdict, gate verdict, approval and ship,
round by round, each candidate's evidence anchors resolved to the trace events they point
to. ``hx audit verify RUN`` (or ``--file audit.jsonl``) checks the hash chain and the
signatures, that every verdict follows from its checks and from the trace rounds it cites,
that every ship follows a passing verdict and equals the fold of its edits. ``hx audit head
RUN`` prints the signed head an auditor keeps, which ``--head`` checks a ledger still reaches.
None of them writes anything to the run.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(audit_group, ["verify", "--help"]).exit_code
0
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape
from rich.tree import Tree

from hx.cli._app import App, pass_app, quarantine_note, run, run_id_option, stdout_console
from hx.replay.audit import Verification, verify_file, verify_run
from hx.replay.errors import LedgerRefused
from hx.replay.ledger_checks import Problem
from hx.replay.ledger_head import SignedHead, check_head, head_of, parse_head
from hx.replay.ledger_view import LedgerListing, LedgerRow, headline, listing, read_ledger
from projections.ledger_records import LedgerEntry
from schemas.edits import Anchor

EXIT_NOT_VERIFIED = 3
"""``hx audit verify`` checked and found the ledger wrong (1 is kept for "could not check": a bad run, no server)."""


@click.command("ledger")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--round", "round_", type=click.IntRange(min=0), metavar="N", help="Only this evolution round.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per ledger event listed (anchors resolved).")
@pass_app
def ledger_command(app: App, run_id: str, round_: int | None, as_json: bool) -> None:
    """List RUN's candidates, verdicts and ships, round by round, with their evidence resolved on the trace.

    Each candidate's evidence anchors (trace positions) are read back one message each and
    shown as the event they point to, or as "unresolved" with the reason.
    """
    shown = run(_listing(app, run_id, round_))
    fault = shown.ledger.first_fault
    if fault is not None:  # listed as it is, this ledger would mislead: say what is wrong instead
        raise LedgerRefused(f"the ledger of run {run_id!r} does not make sense as recorded: {fault} "
                            f"(hx audit verify {run_id} names every problem)")
    if as_json:
        for row in shown.rows:
            click.echo(json.dumps(row.as_dict(), sort_keys=True))
        return
    stdout_console().print(tree(shown))


async def _listing(app: App, run_id: str, round_: int | None) -> LedgerListing:
    async with app.connect(auditor=True) as conn:
        shown = await listing(conn.log, run_id, round_)
        quarantine_note(conn.log)
    return shown


def _row(node: Tree, row: LedgerRow, same_as: LedgerRow | None) -> None:
    branch = node.add(f"[bold]{row.entry.position}[/] {escape(headline(row.entry.event))}")
    if same_as is not None:  # evolvers of one round often cite the same digests: resolved once above
        branch.add(f"evidence: the same {len(row.anchors)} anchor(s) as event {same_as.entry.position}")
        return
    for a in row.anchors:
        where = f"anchor {a.anchor.seq}:{a.anchor.index}" + (f" ({escape(a.anchor.note)})" if a.anchor.note else "")
        if a.resolved:
            branch.add(f"{where} -> {a.type} on {escape(a.subject)}: {escape(a.summary)}")
        else:
            branch.add(f"{where} -> [red]unresolved[/]: {escape(a.problem)}")


def tree(shown: LedgerListing) -> Tree:
    """The listing as a rich tree: a node per round (its decision), a node per event, a leaf per anchor."""
    root = Tree(f"ledger of run [bold]{escape(shown.run_id)}[/]: {shown.events} events, {len(shown.rows)} listed, "
                f"{shown.fetched} trace message(s) read for evidence")
    rounds = sorted({r.round for r in shown.rows} | set(shown.decisions))
    for n in rounds:
        decided = shown.decisions.get(n)
        said = f"{decided.outcome}" + (f": {escape(decided.reason)}" if decided.reason else "") if decided else (
            "not decided")
        node = root.add(f"[bold]round {n}[/]: {said}")
        shown_before: dict[tuple[Anchor, ...], LedgerRow] = {}
        for row in shown.rows:
            if row.round == n:
                key = tuple(a.anchor for a in row.anchors)
                _row(node, row, shown_before.get(key) if key else None)
                shown_before.setdefault(key, row)
    return root


@click.group("audit")
def audit_group() -> None:
    """Check an evolution run's edit ledger: its hash chain, its ships, its verdicts' inputs."""


@audit_group.command("verify")
@click.argument("run_id", metavar="RUN", required=False, callback=run_id_option)
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH",
              help="Verify a copy instead: audit.jsonl from hx export, or hx log dump --stream HX_LEDGER lines "
                   "(RUN picks the run's events).")
@click.option("--against-log", is_flag=True,
              help="With RUN and --file: compare the copy's head with the head of RUN's ledger on the log "
                   "(a copy shorter, longer or different is a problem).")
@click.option("--head", "head_text", metavar="HEAD",
              help="A head kept earlier (hx audit head's JSON line, or a file holding it): the ledger must still "
                   "reach it, signed by the same key.")
@pass_app
@click.pass_context
def verify_command(ctx: click.Context, app: App, run_id: str | None, path: Path | None, against_log: bool,
                   head_text: str | None) -> None:
    """Verify RUN's ledger (or a copy): chain and signatures, every verdict and ship, every citation of the trace.

    Exit 0 when verified; 3 when the ledger is wrong (each problem named: the event, its
    type, what is wrong: edited, dropped, reordered, signature, decision, fold or input); 1
    when it could not be checked.
    """
    if run_id is None and path is None:
        raise click.UsageError("give a RUN, or --file PATH (with RUN: that run's events in the file)")
    if against_log and (run_id is None or path is None):
        raise click.UsageError("--against-log compares a copy with the log: give RUN and --file PATH")
    kept = parse_head(head_text) if head_text is not None else None
    on_log = run(_on_log(app, str(run_id))) if against_log else []
    result = verify_file(path, run_id, on_log) if path is not None else run(_verify(app, str(run_id)))
    if kept is not None and result.ledger is not None:
        result.problems += check_head(result.ledger.entries, result.key, kept)
        result.notes += [] if result.problems else [f"the ledger reaches the kept head (event {kept.position}, "
                                                    f"{kept.type})"]
    click.echo(result.headline())
    click.echo(f"  head: {result.head} (a forger who re-hashes the chain changes it: compare it with a copy)")
    click.echo(f"  {result.signature_line()}")
    for note in result.notes:
        click.echo(f"  note: {note}")
    for problem in result.problems:
        click.echo(f"  {problem}")
    for what in result.unchecked:
        click.echo(f"  not checked: {what}")
    if not result.ok:
        ctx.exit(EXIT_NOT_VERIFIED)


async def _on_log(app: App, run_id: str) -> list[LedgerEntry]:
    async with app.connect(auditor=True) as conn:
        return (await read_ledger(conn.log, run_id)).entries


@audit_group.command("head")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@pass_app
def head_command(app: App, run_id: str) -> None:
    """Print RUN's signed head as one JSON line: keep it elsewhere, and check later with verify --head.

    The head is the ledger's last event: its position, digest (which covers every event
    before it) and signature, and the key the run is signed with. Only a ledger that
    verifies has a head worth keeping: one that does not is refused, its first problem named.
    """
    click.echo(run(_head(app, run_id)).line())


async def _head(app: App, run_id: str) -> SignedHead:
    async with app.connect(auditor=True) as conn:
        result = await verify_run(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
    first: Problem | None = result.first
    if first is not None or result.ledger is None:
        raise LedgerRefused(f"the ledger of run {run_id!r} does not verify: {first} (hx audit verify {run_id})")
    return head_of(result.ledger)


async def _verify(app: App, run_id: str) -> Verification:
    async with app.connect(auditor=True) as conn:
        result = await verify_run(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
        quarantine_note(conn.log)
    return result
