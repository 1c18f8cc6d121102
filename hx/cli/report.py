"""``hx report RUN``: a run as one self-contained HTML page and its PNG figures, folded from the log.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(report_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import click

from hx.cli._app import App, pass_app, quarantine_note, run, run_id_option
from hx.replay.audit import verified_ledger
from hx.report.data import ReportData, learner_records
from hx.report.errors import ReportError
from hx.report.evals import eval_data
from hx.report.html import report_files

REPORTS = Path("reports")
"""Where reports go by default, relative to the working directory: ``reports/RUN/``."""


@click.command("report")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Write the page and figures here  [default: ./reports/RUN]")
@click.option("--evals", "every_eval", is_flag=True,
              help="Show every eval suite score and experiment on the log, not only those about RUN.")
@pass_app
def report_command(app: App, run_id: str, out: Path | None, every_eval: bool) -> None:
    """Write RUN's report to DIR: report.html (self-contained) and one PNG per figure.

    The figures (evolution curves, lever mix, hit rate = realised / predicted flips, ship
    rate = shipped / proposed candidates, ships and regressions, and for a co-evolution run
    the learner's curves) are folded from the run's ledger on HX_LEDGER and its learner
    records on HX_LEARN. The "Eval suite" section (each eval's
    composite with its interval over time, the latest eval's per-task scores) shows the evals
    that judged RUN and "Experiments" the experiments whose spec names RUN; --evals shows every
    eval and experiment on the log. A section with nothing to show is left out. The same log
    gives the same bytes; files of the same names in DIR are replaced.
    """
    from hx.report.figures import figures  # matplotlib (0.2 s) only when a report is drawn, not for --help

    target = out if out is not None else REPORTS / run_id
    check_target(target)
    data = run(_gather(app, run_id, every_eval))
    files = report_files(data, figures(data))
    write(target, files)
    click.echo(f"wrote the report of run {run_id} to {target / 'report.html'} ({len(files) - 1} figures)")


async def _gather(app: App, run_id: str, every_eval: bool) -> ReportData:
    async with app.connect() as conn:
        ledger = await verified_ledger(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
        learner = await learner_records(conn.log, run_id)
        evals = await eval_data(conn.log, run_id, everything=every_eval)
        quarantine_note(conn.log)
    data = ReportData.of([e.event for e in ledger.entries], learner)
    data.evals = evals
    return data


def check_target(target: Path) -> None:
    """Fail before reading the log when ``target`` cannot become a writable directory (nothing is created yet)."""
    existing = target.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ReportError(f"cannot write the report to {target}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ReportError(f"cannot write the report to {target}: {existing} is not writable")


def write(target: Path, files: Mapping[str, bytes]) -> None:
    """Write the report's files into ``target`` (created with its parents)."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name, body in files.items():
            (target / name).write_bytes(body)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ReportError(f"cannot write the report to {target}: {exc.strerror or exc}{where}") from None
