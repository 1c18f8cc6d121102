"""``hx approve``: answer a candidate's request for a human's approval, on the ledger."""

from __future__ import annotations

import getpass

import click

from hx.aegis.ledger import Ledger
from hx.cli._app import App, pass_app, run, run_id_option
from hx.replay.audit import verified_ledger
from schemas.errors import HxError
from schemas.ledger import ApprovalGiven
from streams.signing import LedgerKey


@click.command("approve")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.argument("candidate")
@click.option("--reject", is_flag=True, help="Refuse it instead.")
@click.option("--note", default="", help="Why, for the ledger.")
@pass_app
def approve_command(app: App, run_id: str, candidate: str, reject: bool, note: str) -> None:
    """Approve (or --reject) CANDIDATE of RUN, which passed the gate and waits for a human.

    The answer goes on the run's ledger, signed with this data directory's key; the evolver
    ships an approved candidate in its next round (or when the run is resumed), if its
    variant has not changed since. The run's ledger is verified first; a finished run's
    candidates can no longer ship, so they are not answered.
    """
    run(_approve(app, run_id, candidate, not reject, note))
    click.echo(f"{'approved' if not reject else 'rejected'} {candidate} of {run_id}")


async def _approve(app: App, run_id: str, candidate: str, approved: bool, note: str) -> None:
    async with app.connect() as conn:
        state = await verified_ledger(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
        record = state.candidates.get(candidate)
        if record is None:
            raise HxError(f"run {run_id!r} has no candidate {candidate!r}; candidates: "
                          f"{', '.join(sorted(state.candidates)) or 'none'}")
        if not record.waiting:
            why = "was already answered" if record.approval is not None else "does not wait for approval"
            raise HxError(f"candidate {candidate} {why}")
        if state.finished is not None:
            raise HxError(f"run {run_id!r} finished ({state.finished.status}, event {state.finished_position}): "
                          f"nothing would ever ship {candidate}; start a new run to try it")
        ledger = Ledger(conn, run_id, LedgerKey.of(app.settings.data_dir))
        try:
            if await ledger.load() is None or len(ledger.records) != len(state.entries):
                raise HxError(f"the ledger of run {run_id!r} moved on while it was verified; answer again")
            await ledger.append(ApprovalGiven(run_id=run_id, candidate=candidate, approved=approved,
                                              by=getpass.getuser(), note=note))
        finally:
            await ledger.close()
